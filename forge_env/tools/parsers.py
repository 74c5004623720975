"""Parsing the assistant's raw text into reasoning, content and tool calls.

Each model family writes tool calls its own way; the parsers for Hermes/Qwen, Llama-3.x JSON, Mistral
``[TOOL_CALLS]``, DeepSeek-V3/V3.1, gpt-oss harmony and Kimi-K2 live in :mod:`forge_env.tools.formats`
and are looked up here by name (:func:`get_parser`) or detected from a chat template
(:func:`detect_parser`).

The contract every parser keeps, because model output is hostile input:

* a malformed call is never dropped silently: it is reported in ``ParsedAction.errors`` so the
  environment can answer it with an error observation;
* reasoning (``<think>…</think>``, harmony's ``analysis`` channel) is split off into
  ``ParsedAction.reasoning`` and is never parsed for tool calls: a call the model only thought about
  is not executed;
* no input makes a parser raise or run unbounded: JSON nested thousands deep, a 5000-digit integer or a
  parser's own bug become an error in ``ParsedAction.errors`` (:func:`parse_tool_calls` guards even
  user-supplied parsers).
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
_QUOTE = 200


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
        return None, f"JSON value out of range ({str(exc)[:_QUOTE]})"


def quote(text: str) -> str:
    """A bounded quotation of model text for an error message."""
    return repr(text[:_QUOTE]) + ("..." if len(text) > _QUOTE else "")


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


# ----------------------------------------------------------------------------- registry

def _registry() -> dict[str, ToolCallParser]:
    from forge_env.tools import formats

    return formats.PARSERS


def parser_names() -> list[str]:
    """The names :func:`get_parser` knows."""
    return sorted(_registry())


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    """Look up a tool-call parser by name (see :func:`parser_names`), or pass a callable through guarded."""
    if callable(name):
        return guarded(name)
    try:
        return guarded(_registry()[name])
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {parser_names()}") from None


def guarded(parser: ToolCallParser) -> ToolCallParser:
    """``parser`` that answers with an error instead of raising, whatever the text (idempotent)."""
    if getattr(parser, "_forge_guarded", False):
        return parser

    def parse(text: str) -> ParsedAction:
        try:
            parsed = parser(text)
        except (RecursionError, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            return ParsedAction(content=text.strip(), errors=[
                f"the tool calls could not be parsed ({type(exc).__name__}: {str(exc)[:_QUOTE]})"])
        if not isinstance(parsed, ParsedAction):
            return ParsedAction(content=text.strip(), errors=[
                f"the tool-call parser returned {type(parsed).__name__}, not a ParsedAction"])
        return parsed

    parse._forge_guarded = True  # type: ignore[attr-defined]
    parse.__name__ = getattr(parser, "__name__", "parse")
    parse.__doc__ = parser.__doc__
    return parse


def parse_tool_calls(text: str, parser: str | ToolCallParser = "hermes") -> ParsedAction:
    """Parse raw assistant text with the named parser (Hermes/Qwen by default); never raises on bad text."""
    return get_parser(parser)(text)


def detect_parser(chat_template: str | None) -> str:
    """The parser name for a chat template, from the tool-call markup it renders (``"hermes"`` if none)."""
    from forge_env.tools import formats

    return formats.detect(chat_template or "")


def parse_hermes(text: str) -> ParsedAction:
    """Hermes/Qwen ``<tool_call>{...}</tool_call>`` (kept here for existing imports)."""
    from forge_env.tools.formats import parse_hermes as parse

    return parse(text)


def format_hermes_call(name: str, arguments: dict) -> str:
    """Render one call the way a Hermes/Qwen model writes it (used by expert demonstrations)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

