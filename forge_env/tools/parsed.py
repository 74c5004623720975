"""What a tool-call parser returns, and the pieces every format's parser shares.

The bottom of the tool-call parsing stack, imported one way: :mod:`forge_env.tools.formats` (one parser per
model family) builds on this module, and :mod:`forge_env.tools.parsers` (lookup by name, guarding,
detection) builds on both. Nothing here imports either of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forge_env.types import ToolCall, make_tool_call

#: At most this many calls are parsed from one turn; more are reported as an error.
MAX_CALLS_PER_TURN = 64
#: Error messages quote at most this many characters of the offending text.
QUOTE_CHARS = 200


@dataclass
class ParsedAction:
    """The assistant text split into reasoning, visible content, well-formed tool calls and parse errors."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str | None = None
    raw_content: str | None = None
    """The content before whitespace was stripped (what a chat server would hold; None: same as content)."""


ToolCallParser = Callable[[str], ParsedAction]


# ----------------------------------------------------------------------------- shared pieces

def load_json(body: str) -> tuple[Any, str | None]:
    """``json.loads`` that answers instead of raising: ``(value, None)`` or ``(None, reason)``.

    Besides malformed JSON this bounds what the standard library raises on hostile input: nesting deeper
    than the interpreter's recursion limit (RecursionError) and integers past Python's digit limit
    (ValueError).
    """
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at char {exc.pos})"
    except RecursionError:
        return None, "JSON nested too deeply"
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        return None, f"JSON value out of range ({str(exc)[:QUOTE_CHARS]})"


def quote(text: str) -> str:
    """A bounded quotation of model text for an error message."""
    return repr(text[:QUOTE_CHARS]) + ("..." if len(text) > QUOTE_CHARS else "")


class CallCollector:
    """Accumulates the calls and errors of one turn, bounded by :data:`MAX_CALLS_PER_TURN`."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.seen = 0

    def add(self, name: Any, arguments: Any, call_id: str | None = None) -> None:
        """Validate one call (a string name, an object of arguments) and keep it or record why not."""
        self.seen += 1
        index = self.seen
        if index > MAX_CALLS_PER_TURN:
            if index == MAX_CALLS_PER_TURN + 1:
                self.errors.append(f"more than {MAX_CALLS_PER_TURN} tool calls in one turn; the rest were ignored")
            return
        if not isinstance(name, str) or not name:
            self.errors.append(f'tool call {index} must be an object like {{"name": ..., "arguments": {{...}}}}')
            return
        if isinstance(arguments, str):
            arguments, problem = load_json(arguments) if arguments.strip() else ({}, None)
            if problem:
                self.errors.append(f"tool call {index} ({name}): 'arguments' is {problem}")
                return
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            self.errors.append(f"tool call {index} ({name}): 'arguments' must be a JSON object, "
                               f"got {type(arguments).__name__}")
            return
        try:
            self.calls.append(make_tool_call(name, arguments, call_id=call_id))
        except (RecursionError, ValueError) as exc:
            self.errors.append(f"tool call {index} ({name}): arguments cannot be encoded ({type(exc).__name__})")

    def add_json(self, body: str) -> None:
        """One call written as a JSON object ``{"name": ..., "arguments"|"parameters": {...}}``."""
        payload, problem = load_json(body.strip())
        if problem:
            self.seen += 1
            if self.seen <= MAX_CALLS_PER_TURN:
                self.errors.append(f"tool call {self.seen} is {problem}: {quote(body.strip())}")
            return
        if not isinstance(payload, dict):
            self.seen += 1
            self.errors.append(f'tool call {self.seen} must be an object like {{"name": ..., "arguments": {{...}}}}')
            return
        self.add(payload.get("name"), payload.get("arguments", payload.get("parameters", {})),
                 payload.get("id") if isinstance(payload.get("id"), str) else None)

    def result(self, content: str, reasoning: str | None) -> ParsedAction:
        return ParsedAction(content=content.strip(), tool_calls=self.calls, errors=self.errors, reasoning=reasoning,
                            raw_content=content)


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Split ``<think>…</think>`` reasoning off the text: ``(reasoning or None, the rest)``.

    The closing tag alone counts too (Qwen3 and DeepSeek-R1 put ``<think>`` in the generation prompt, so
    the sample starts inside the block). An unclosed block is all reasoning: the model never got to act.
    """
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        inner = text[:close]
        opened = inner.find(_THINK_OPEN)
        before = inner[:opened] if opened >= 0 else ""
        reasoning = inner[opened + len(_THINK_OPEN):] if opened >= 0 else inner
        return reasoning.strip("\n"), before + text[close + len(_THINK_CLOSE):].lstrip("\n")
    opened = text.find(_THINK_OPEN)
    if opened >= 0:
        return text[opened + len(_THINK_OPEN):].strip("\n"), text[:opened]
    return None, text
