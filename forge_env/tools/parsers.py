"""Parsing the assistant's raw text into content and tool calls.

The default format is Hermes/Qwen: each call is
``<tool_call>{"name": "...", "arguments": {...}}</tool_call>`` in the text. A
malformed call is not dropped silently: it is reported in ``ParsedAction.errors``
so the environment can answer it with an error observation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from forge_env.types import ToolCall, make_tool_call

_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ParsedAction:
    """The assistant text split into visible content, well-formed tool calls and parse errors."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_hermes(text: str) -> ParsedAction:
    """Parse Hermes/Qwen-style ``<tool_call>`` blocks; an unclosed block at the end is parsed too."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for index, match in enumerate(_HERMES_CALL.finditer(text)):
        body = match.group(1).strip()
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {index + 1} is not valid JSON ({exc.msg} at char {exc.pos}): {body[:200]!r}")
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            errors.append(f'tool call {index + 1} must be an object like {{"name": ..., "arguments": {{...}}}}')
            continue
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                errors.append(f"tool call {index + 1}: 'arguments' must be a JSON object")
                continue
        if not isinstance(arguments, dict):
            errors.append(f"tool call {index + 1}: 'arguments' must be a JSON object, got {type(arguments).__name__}")
            continue
        calls.append(make_tool_call(payload["name"], arguments))
    content = _HERMES_CALL.sub("", text).strip()
    return ParsedAction(content=content, tool_calls=calls, errors=errors)


ToolCallParser = Callable[[str], ParsedAction]

PARSERS: dict[str, ToolCallParser] = {"hermes": parse_hermes, "qwen": parse_hermes}


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    """Look up a tool-call parser by name (``"hermes"``/``"qwen"``), or pass a callable through."""
    if callable(name):
        return name
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {sorted(PARSERS)}") from None


def parse_tool_calls(text: str, parser: str | ToolCallParser = "hermes") -> ParsedAction:
    """Parse raw assistant text with the named parser (Hermes/Qwen by default)."""
    return get_parser(parser)(text)


def format_hermes_call(name: str, arguments: dict) -> str:
    """Render one call the way a Hermes/Qwen model writes it (used by expert demonstrations)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
