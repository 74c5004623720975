"""Chat data types in the OpenAI chat format.

Messages, tool calls and tool specs are plain dicts (typed with ``TypedDict``) so
they are JSON-serialisable as they are and travel unchanged between processes,
chat templates and trajectory files.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, NotRequired, TypedDict

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


class FunctionCall(TypedDict):
    """The function part of a tool call; ``arguments`` is a JSON object encoded as a string."""

    name: str
    arguments: str


class ToolCall(TypedDict):
    """One tool call made by the assistant."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict):
    """One chat message. ``tool_calls`` only on assistant messages, ``tool_call_id``/``name`` on tool messages."""

    role: Role
    content: str
    tool_calls: NotRequired[list[ToolCall]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]
    reasoning_content: NotRequired[str]


class FunctionSpec(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]


class ToolSpec(TypedDict):
    """A tool offered to the model: ``{"type": "function", "function": {name, description, parameters}}``."""

    type: Literal["function"]
    function: FunctionSpec


def new_call_id() -> str:
    """A fresh tool-call id in the usual ``call_<hex>`` shape."""
    return f"call_{uuid.uuid4().hex[:16]}"


def make_tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> ToolCall:
    """Build a ToolCall; ``arguments`` may be a dict (encoded to JSON) or an already encoded string."""
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or new_call_id(), "type": "function", "function": {"name": name, "arguments": encoded}}


def system_message(content: str) -> Message:
    return {"role": "system", "content": content}


def user_message(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant_message(content: str = "", tool_calls: list[ToolCall] | None = None) -> Message:
    message: Message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def tool_message(content: str, tool_call_id: str, name: str) -> Message:
    return {"role": "tool", "content": content, "tool_call_id": tool_call_id, "name": name}


class MessageFormatError(ValueError):
    """A message dict does not follow the chat format."""


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string, ``None`` (empty), or the OpenAI list of text parts
    (``[{"type": "text", "text": ...}, ...]``, what the ``openai`` SDK produces), joined. Anything else (an
    image part, a number) raises ``MessageFormatError``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessageFormatError(f"message content must be a string or a list of text parts, got {type(content).__name__}")
    texts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise MessageFormatError(f"only text content parts are supported ({{'type': 'text', 'text': ...}}), got {part!r}"[:300])
        texts.append(part["text"])
    return "".join(texts)


def validate_message(message: Any) -> Message:
    """Check that ``message`` is a well-formed chat message and return it; raise MessageFormatError otherwise."""
    if not isinstance(message, dict):
        raise MessageFormatError(f"a message must be a dict, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise MessageFormatError(f"message role must be one of {ROLES}, got {role!r}")
    content = message.get("content", "")
    if content is not None and not isinstance(content, str):
        content_text(content)  # raises for anything but a list of text parts
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise MessageFormatError("only assistant messages may carry tool_calls")
        if not isinstance(calls, list):
            raise MessageFormatError("tool_calls must be a list")
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise MessageFormatError(f"malformed tool call {call!r}: expected {{'function': {{'name', 'arguments'}}}}")
    return message  # type: ignore[return-value]
