"""The OpenEnv wire format as forge-env speaks it: frames, error codes, actions, observations, schemas.

Shared by the server (:mod:`forge_env.openenv.app`) and the client (:mod:`forge_env.openenv.client_env`),
so both sides agree on one definition. It follows ``openenv-core`` 0.3.0:

* client frames: ``{"type": "reset", "data": {seed?, episode_id?, options?}}``,
  ``{"type": "step", "data": <action>}``, ``{"type": "state"}``, ``{"type": "close"}``, ``{"type": "mcp", ...}``;
* server frames: ``{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}``,
  ``{"type": "state", "data": {...}}``, ``{"type": "error", "data": {"message": ..., "code": ...}}``.

A forge-env action is the assistant's turn: ``{"content": str, "tool_calls"?: [...]}`` (OpenAI format;
``role`` may be given and must then be ``"assistant"``). ``{"content": raw_reply}`` without ``tool_calls`` is
parsed for tool calls by the environment exactly like a string action in-process. OpenEnv's MCP actions
``{"type": "call_tool", "tool_name", "arguments"}`` are accepted too (one tool call as a turn).

A forge-env observation holds ``messages`` (the new messages), ``tools`` (at reset), ``terminated``,
``truncated`` and ``info``; the envelope carries OpenEnv's ``reward`` and ``done`` (= terminated or truncated).
"""

from __future__ import annotations

import json
import math
from typing import Any

from forge_env.types import Message

PROTOCOL_VERSION = "forge-env/openenv-1"

# OpenEnv's own codes (openenv.core.env_server.types.WSErrorCode) ...
INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
SESSION_ERROR = "SESSION_ERROR"
# ... and the ones forge-env adds, so a client can tell what to do next.
RESET_NEEDED = "RESET_NEEDED"  # step before reset: send a reset frame
EPISODE_ENDED = "EPISODE_ENDED"  # step after done: send a reset frame
SESSION_LOST = "SESSION_LOST"  # the replica holding the episode died and it could not be resumed: reset starts anew
SESSION_EXPIRED = "SESSION_EXPIRED"  # the connection was idle past the server's TTL; it is closed
SERVER_SHUTTING_DOWN = "SERVER_SHUTTING_DOWN"
MALFORMED_FRAME = "MALFORMED_FRAME"  # client side: the server's frame does not follow the protocol

MAX_EPISODE_ID_CHARS = 255


class ProtocolError(ValueError):
    """A frame the server cannot act on; becomes an error frame with ``code``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def error_frame(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def observation_data(messages: list[Message], reward: float | None, terminated: bool, truncated: bool,
                     info: dict[str, Any], tools: list[dict] | None = None) -> dict[str, Any]:
    """The ``data`` of an observation frame (also the body of ``POST /reset`` and ``/step``)."""
    observation: dict[str, Any] = {"messages": messages, "terminated": terminated, "truncated": truncated,
                                   "info": info}
    if tools is not None:
        observation["tools"] = tools
    return {"observation": observation, "reward": reward, "done": bool(terminated or truncated)}


def reset_observation(messages: list[Message], info: dict[str, Any]) -> dict[str, Any]:
    """Observation data of a reset: tools move from ``info`` to the observation, reward is ``None``."""
    info = dict(info)
    tools = info.pop("tools", [])
    return observation_data(messages, None, False, False, info, tools=tools)


def read_reward(value: Any) -> float:
    """A reward from a server's frame: a finite number, ``None`` read as 0; anything else is malformed."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProtocolError(MALFORMED_FRAME, f"the server sent a reward that is not a finite number: {value!r:.100}")
    return float(value)


def read_observation(data: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any], list[dict]]:
    """``(messages, reward, terminated, truncated, info, tools)`` of a forge server's observation ``data``,
    checked: the server is as untrusted as the model (a malformed frame raises ``ProtocolError``)."""
    observation = data.get("observation") if isinstance(data, dict) else None
    if observation is None:
        observation = {}
    if not isinstance(observation, dict):
        raise ProtocolError(MALFORMED_FRAME, f"the observation is not a JSON object: {observation!r:.100}")
    messages, tools, info = observation.get("messages", []), observation.get("tools", []), observation.get("info")
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str | None)
            for m in messages):
        raise ProtocolError(MALFORMED_FRAME, "observation.messages must be a list of messages with a string role "
                                             f"and string content: {messages!r:.200}")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ProtocolError(MALFORMED_FRAME, f"observation.tools must be a list of objects: {tools!r:.200}")
    if info is not None and not isinstance(info, dict):
        raise ProtocolError(MALFORMED_FRAME, f"observation.info must be an object: {info!r:.100}")
    terminated = observation.get("terminated", data.get("done", False) if isinstance(data, dict) else False)
    truncated = observation.get("truncated", False)
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise ProtocolError(MALFORMED_FRAME, "observation.terminated and truncated must be booleans")
    reward = read_reward(data.get("reward") if isinstance(data, dict) else None)
    return [dict(m) for m in messages], reward, terminated, truncated, dict(info or {}), list(tools)  # type: ignore[misc]


def parse_reset(data: Any) -> tuple[int | None, dict[str, Any] | None, str | None]:
    """``(seed, options, episode_id)`` from a reset frame's data; other keys are ignored as OpenEnv does."""
    if data is None:
        return None, None, None
    if not isinstance(data, dict):
        raise ProtocolError(VALIDATION_ERROR, f"reset data must be a JSON object, got {type(data).__name__}")
    seed = data.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ProtocolError(VALIDATION_ERROR, f"reset seed must be a non-negative integer, got {seed!r}")
    options = data.get("options")
    if options is not None and not isinstance(options, dict):
        raise ProtocolError(VALIDATION_ERROR, f"reset options must be a JSON object, got {type(options).__name__}")
    if "task" in data:  # a convenience: {"task": {...}} means options={"task": {...}}
        options = {**(options or {}), "task": data["task"]}
    episode_id = data.get("episode_id")
    if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > MAX_EPISODE_ID_CHARS):
        raise ProtocolError(VALIDATION_ERROR, f"episode_id must be a string of at most {MAX_EPISODE_ID_CHARS} "
                                              "characters")
    return seed, options, episode_id


def parse_action(data: Any) -> Message | str:
    """The environment's action for a step frame's data.

    Shape problems of the frame itself (no object at all) raise :class:`ProtocolError`; everything inside
    a turn (a bad role, a non-string content, malformed tool calls) is left for the environment, which
    answers it with an error observation, as in-process.
    """
    if isinstance(data, str):
        return data
    if not isinstance(data, dict):
        raise ProtocolError(VALIDATION_ERROR, "step data must be an action object such as "
                                              f'{{"content": "..."}}, got {type(data).__name__}')
    if data.get("type") == "call_tool":
        name, arguments = data.get("tool_name"), data.get("arguments", {})
        call = {"id": "call_0", "type": "function",
                "function": {"name": name if isinstance(name, str) else "", "arguments": json.dumps(arguments)}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}  # type: ignore[typeddict-item]
    role = data.get("role", "assistant")
    content = data.get("content", "")
    if "tool_calls" not in data and role == "assistant" and isinstance(content, str):
        return content  # a raw model reply: the environment parses its tool calls
    action: dict[str, Any] = {"role": role, "content": content}
    if data.get("tool_calls"):
        action["tool_calls"] = data["tool_calls"]
    return action  # type: ignore[return-value]


def action_to_wire(action: Message | str) -> dict[str, Any]:
    """The step data for a TextEnv action (a message dict or a raw reply)."""
    if isinstance(action, str):
        return {"content": action}
    if not isinstance(action, dict):
        return {"content": action}  # the server's environment answers with an error observation
    wire = {key: action[key] for key in ("role", "content", "tool_calls") if key in action}
    wire.setdefault("content", "")
    return wire


def mcp_tools(tools: list[dict]) -> list[dict[str, Any]]:
    """OpenAI tool specs as MCP tools (``name``, ``description``, ``input_schema``), as ``list_tools`` returns."""
    out = []
    for spec in tools:
        function = spec.get("function", {})
        out.append({"name": function.get("name", ""), "description": function.get("description", ""),
                    "input_schema": function.get("parameters", {"type": "object", "properties": {}})})
    return out


_MESSAGE_SCHEMA = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
        "name": {"type": "string"},
    },
}

ACTION_SCHEMA: dict[str, Any] = {
    "title": "AssistantTurn",
    "description": "The assistant's turn. Without tool_calls, content is parsed for tool calls like a raw "
                   "model reply. {'type': 'call_tool', 'tool_name', 'arguments'} is one tool call.",
    "type": "object",
    "properties": {
        "content": {"type": "string"},
        "role": {"type": "string", "const": "assistant"},
        "tool_calls": {"type": "array", "items": {
            "type": "object", "required": ["function"],
            "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                           "function": {"type": "object", "required": ["name", "arguments"],
                                        "properties": {"name": {"type": "string"},
                                                       "arguments": {"type": "string"}}}}}},
    },
}

OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "TextObservation",
    "type": "object",
    "required": ["messages", "terminated", "truncated", "info"],
    "properties": {
        "messages": {"type": "array", "items": _MESSAGE_SCHEMA, "description": "the new messages"},
        "tools": {"type": "array", "items": {"type": "object"}, "description": "OpenAI tool specs (at reset)"},
        "terminated": {"type": "boolean"},
        "truncated": {"type": "boolean"},
        "info": {"type": "object"},
        "reward": {"type": ["number", "null"]},
        "done": {"type": "boolean", "description": "terminated or truncated"},
    },
}

STATE_SCHEMA: dict[str, Any] = {
    "title": "EpisodeState",
    "type": "object",
    "properties": {"episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer", "minimum": 0},
                   "env_id": {"type": "string"}, "done": {"type": "boolean"},
                   "total_reward": {"type": "number"}},
}
