"""OpenEnvTextEnv: any OpenEnv server as a forge-env ``TextEnv``.

    env = OpenEnvTextEnv("http://127.0.0.1:8000")
    observation, info = await env.areset(seed=0)
    observation, reward, terminated, truncated, info = await env.astep(model_reply)

Two kinds of server are understood (``mode="auto"`` tells them apart from the reset observation):

* ``"forge"``: a ``forge-env serve`` server. Turns go over the wire as they are; the remote environment
  parses tool calls, runs tools, scores, and reports ``terminated``/``truncated`` separately.
* ``"tools"``: a plain OpenEnv environment whose actions are MCP tool calls (``list_tools`` /
  ``call_tool``). The tools it lists become this env's tools; the model's tool calls are parsed and
  validated here (the usual TextEnv turn rules) and each is sent as a ``call_tool`` step. Rewards and
  ``done`` come from the server; an answer without tool calls ends the episode, scored by calling
  ``final_answer_tool`` if one is named.

One WebSocket connection is one episode session on the server; it is opened at the first ``areset`` and
re-opened by a later ``areset`` if it broke (the rule of :class:`~forge_env.core.remote.RemoteSessions`,
shared with the EnvService client ``RemoteEnv``; ``forge_env.core.remote`` says why the transports differ).
Error frames raise :class:`OpenEnvError` with the server's code. The connection, its frames and
``OpenEnvError`` live in :mod:`forge_env.openenv.client_connection`.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import gymnasium

from forge_env.core.env import (
    AnswerOutcome,
    EpisodeEndedError,
    EpisodeState,
    ResetNeededError,
    TextEnv,
)
from forge_env.core.remote import RemoteSessions
from forge_env.openenv import protocol as wire
from forge_env.openenv.client_connection import (
    CLOSING_CODES,
    CONNECTION_LOST,
    OpenEnvConnection,
    OpenEnvError,
    observation_of,
    read_reply,
    websocket_url,
)
from forge_env.tools import Tool, ToolError
from forge_env.types import Message

__all__ = ["CLOSING_CODES", "CONNECTION_LOST", "OpenEnvError", "OpenEnvTextEnv", "result_text", "websocket_url"]


class OpenEnvTextEnv(OpenEnvConnection, RemoteSessions, TextEnv):
    """A ``TextEnv`` whose episodes run on an OpenEnv server (see the module docstring).

    Args:
        url: the server, ``http://host:port`` (``ws://`` works too).
        token: sent as ``Authorization: Bearer TOKEN`` (``forge-env serve --token``).
        mode: ``"auto"``, ``"forge"`` or ``"tools"``.
        reset_kwargs: extra fields of every reset frame (environment-specific reset parameters).
        prompt_field: tools mode: the reset observation's field holding the task text (default: the only
            string field, else the whole observation as JSON).
        final_answer_tool / answer_argument: tools mode: a final answer is sent as this tool's call with
            ``{answer_argument: text}``; without one, a final answer ends the episode with reward 0.
        connect_timeout_s / message_timeout_s: how long to wait for the connection and for each reply.
        max_message_bytes: the largest frame accepted from the server (large observations need more).
        **kwargs: :class:`TextEnv` options; they apply in tools mode (``max_turns``, ``tool_parser``, ...),
            while a forge server applies its own environment's. Tool calls run one at a time.
    """

    def __init__(self, url: str, *, token: str | None = None, mode: str = "auto",
                 reset_kwargs: dict[str, Any] | None = None, prompt_field: str | None = None,
                 final_answer_tool: str | None = None, answer_argument: str = "answer",
                 connect_timeout_s: float = 30.0, message_timeout_s: float = 300.0,
                 max_message_bytes: int = 64 * 1024 * 1024, **kwargs: Any):
        if mode not in ("auto", "forge", "tools"):
            raise ValueError(f"mode must be 'auto', 'forge' or 'tools', got {mode!r}")
        self._init_args = dict(url=url, token=token, mode=mode, reset_kwargs=reset_kwargs, prompt_field=prompt_field,
                               final_answer_tool=final_answer_tool, answer_argument=answer_argument,
                               connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s,
                               max_message_bytes=max_message_bytes, **kwargs)
        kwargs.setdefault("parallel_tool_calls", False)  # one connection answers one request at a time
        kwargs.setdefault("tool_timeout", message_timeout_s)
        super().__init__(**kwargs)
        self.url = url
        self.ws_url = websocket_url(url)
        self.token = token
        self.mode = mode
        self.reset_kwargs = dict(reset_kwargs or {})
        self.prompt_field = prompt_field
        self.final_answer_tool = final_answer_tool
        self.answer_argument = answer_argument
        self.connect_timeout_s = connect_timeout_s
        self.message_timeout_s = message_timeout_s
        self.max_message_bytes = max_message_bytes
        self.remote_mode: str | None = None
        self._ws: Any = None
        self._ws_loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._remote_done = False

    def __deepcopy__(self, memo: dict) -> OpenEnvTextEnv:
        """A new, unconnected client of the same server (``check_env`` copies instances this way)."""
        return type(self)(**copy.deepcopy(self._init_args, memo))

    # ----------------------------------------------------------------- episodes
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                     ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on the server (``options={"task": ...}`` is passed on to forge servers)."""
        gymnasium.Env.reset(self, seed=seed)
        if self.state is not None and not self.state.released:
            await self._teardown()
        options = dict(options or {})
        data: dict[str, Any] = {**self.reset_kwargs}
        if seed is not None:
            data["seed"] = seed
        if "task" in options:
            data["options"] = {"task": options["task"]}
        reused = self._connected_here()
        if not reused:
            await self._connect()
        # A reused connection may have died quietly: then a fresh one takes the reset.
        reply = await self._reset_remote(lambda: self._request({"type": "reset", "data": data}), retry=reused)
        observation = observation_of(reply)
        self.remote_mode = self.mode if self.mode != "auto" else (
            "forge" if isinstance(observation.get("messages"), list) and "terminated" in observation else "tools")
        self._remote_done = bool(reply.get("done"))
        if self.remote_mode == "forge":
            opening, _, _, _, info, tools_specs = read_reply(reply)
            info = {**info, "tools": tools_specs}
            self._episode_tools = {}
        else:
            opening = self._opening(observation)
            tools = await self._remote_tools()
            self._episode_tools = {t.name: t for t in tools}
            info = {"tools": [t.spec for t in tools], "turn": 0}
        task = {"seed": seed, **({"task": options["task"]} if "task" in options else {})}
        state = EpisodeState(task=task)
        state.messages.extend(opening)
        state.chars = sum(len(m.get("content") or "") for m in opening)
        self.state = state
        return opening, info  # type: ignore[return-value]

    async def astep(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        state = self.state
        if state is None:
            raise ResetNeededError("call reset() before step()")
        if state.done:
            raise EpisodeEndedError("this episode has ended (terminated or truncated); call reset() to start another")
        if self.remote_mode == "forge":
            return await self._forge_step(action, state)
        state.data["remote_reward"] = 0.0
        observation, reward, terminated, truncated, info = await super().astep(action)
        if "transport_error" in state.data:  # the server or the connection failed: not the model's doing
            raise state.data.pop("transport_error")
        remote_reward = state.data.pop("remote_reward", 0.0)  # rewards the server gave for this turn's calls
        reward += remote_reward
        state.total_reward += remote_reward
        if self._remote_done and not (terminated or truncated):
            terminated, state.done = True, True
            await self._teardown()
        if terminated or truncated:
            info["episode_summary"] = {**info.get("episode_summary", {}), "return": state.total_reward}
        return observation, float(reward), terminated, truncated, info

    async def _forge_step(self, action: Any, state: EpisodeState) -> tuple[list[Message], float, bool, bool, dict]:
        state.turn += 1
        state.messages.append({"role": "assistant", "content": action} if isinstance(action, str)
                              else copy.deepcopy(action))
        reply = await self._request({"type": "step", "data": wire.action_to_wire(action)})
        messages, reward, terminated, truncated, info, _ = read_reply(reply)
        state.messages.extend(messages)
        state.total_reward += reward
        if terminated or truncated:
            state.done = state.released = True
        return messages, reward, terminated, truncated, info  # type: ignore[return-value]

    async def aclose(self) -> None:
        """End the episode and close the connection (the server frees the session)."""
        if self.state is not None and not self.state.released:
            await self._teardown()
        await self._drop_connection()

    def _session_lost(self, error: BaseException) -> bool:
        return isinstance(error, OpenEnvError) and error.code == CONNECTION_LOST

    async def _renew_session(self) -> None:
        await self._connect()

    # ----------------------------------------------------------------- tools mode
    def _opening(self, observation: dict[str, Any]) -> list[Message]:
        if self.prompt_field is not None:
            if self.prompt_field not in observation:
                raise OpenEnvError(f"the reset observation has no field {self.prompt_field!r} "
                                   f"(fields: {sorted(observation)})")
            value = observation[self.prompt_field]
            text = value if isinstance(value, str) else json.dumps(value)
        else:
            strings = [v for v in observation.values() if isinstance(v, str)]
            text = strings[0] if len(strings) == 1 else json.dumps(observation, sort_keys=True)
        opening: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*opening, {"role": "user", "content": text}]

    async def _remote_tools(self) -> list[Tool]:
        reply = await self._request({"type": "step", "data": {"type": "list_tools"}})
        listed = observation_of(reply).get("tools") or []
        if not isinstance(listed, list):
            raise OpenEnvError(f"list_tools: 'tools' is not a list: {listed!r:.100}", wire.MALFORMED_FRAME)
        tools = []
        for entry in listed:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            schema = entry.get("input_schema") or entry.get("inputSchema") or {}
            if not isinstance(schema, dict):
                raise OpenEnvError(f"list_tools: the input schema of {entry['name']!r:.60} is not an object",
                                   wire.MALFORMED_FRAME)
            schema = dict(schema)
            schema.setdefault("type", "object")
            schema.setdefault("properties", {})
            tools.append(Tool(name=entry["name"], description=entry.get("description") or "", parameters=schema,
                              fn=self._tool_caller(entry["name"])))
        return tools

    def _tool_caller(self, name: str) -> Any:
        async def call_remote_tool(**arguments: Any) -> str:
            try:
                reply = await self._request({"type": "step", "data": {"type": "call_tool", "tool_name": name,
                                                                      "arguments": arguments}})
                return self._tool_result(name, reply)
            except OpenEnvError as error:
                if self.state is not None:  # TextEnv would show it to the model as a tool error; astep raises it
                    self.state.data["transport_error"] = error
                raise

        return call_remote_tool

    def _tool_result(self, name: str, reply: dict[str, Any]) -> str:
        """Fold a ``call_tool`` reply's reward/done into the episode and return the text the model sees."""
        if self.state is not None:
            try:
                reward = wire.read_reward(reply.get("reward"))
            except wire.ProtocolError as error:
                raise OpenEnvError(str(error), error.code) from None
            self.state.data["remote_reward"] = self.state.data.get("remote_reward", 0.0) + reward
        self._remote_done = self._remote_done or bool(reply.get("done"))
        observation = observation_of(reply)
        error = observation.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise ToolError(f"{name}: {message}")
        return result_text(observation.get("result"))

    async def on_final_answer(self, message: Message, state: EpisodeState) -> AnswerOutcome:
        if self.final_answer_tool is None:
            return AnswerOutcome(reward=0.0, done=True)
        answer: Any = message.get("content") or ""
        answer_tool = self._episode_tools.get(self.final_answer_tool)
        if answer_tool is not None:
            kind = answer_tool.parameters.get("properties", {}).get(self.answer_argument, {}).get("type")
            if kind not in (None, "string"):
                try:
                    answer = json.loads(answer)  # the reply "42" for an integer parameter is 42
                except ValueError:
                    pass
        arguments: dict[str, Any] = {self.answer_argument: answer}
        if answer_tool is not None:
            try:
                arguments = answer_tool.validate(arguments)
            except ToolError as error:
                return AnswerOutcome(reward=0.0, done=True, messages=[{"role": "user", "content": f"Error: {error}"}])
        reply = await self._request({"type": "step", "data": {
            "type": "call_tool", "tool_name": self.final_answer_tool, "arguments": arguments}})
        before = state.data.get("remote_reward", 0.0)
        try:
            text = self._tool_result(self.final_answer_tool, reply)
        except ToolError as error:
            text = f"Error: {error}"
        reward = state.data.get("remote_reward", 0.0) - before
        state.data["remote_reward"] = before  # counted here, not again in astep
        return AnswerOutcome(reward=reward, done=True, messages=[{"role": "user", "content": text}] if text else [])


def result_text(result: Any) -> str:
    """An MCP tool result as text: its text contents joined, else its structured data as JSON."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        content = result.get("content")
        if isinstance(content, list):
            texts = [c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text"]
            if texts:
                return "\n".join(texts)
        for key in ("structured_content", "data"):
            if result.get(key) is not None:
                return result[key] if isinstance(result[key], str) else json.dumps(result[key])
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
