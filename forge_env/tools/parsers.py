"""Parsing the assistant's raw text into reasoning, content and tool calls.

Each model family writes tool calls its own way; the parsers for Hermes/Qwen, Llama-3.x JSON, Mistral
``[TOOL_CALLS]``, DeepSeek-V3/V3.1, gpt-oss harmony and Kimi-K2 live in :mod:`forge_env.tools.formats`
and are looked up here by name (:func:`get_parser`) or detected from a chat template
(:func:`detect_parser`).

The modules import one way: :mod:`forge_env.tools.parsed` (``ParsedAction`` and the shared pieces) <-
:mod:`forge_env.tools.formats` (the parsers) <- this module.

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

from forge_env.tools import formats
from forge_env.tools.parsed import MAX_CALLS_PER_TURN, QUOTE_CHARS, ParsedAction, ToolCallParser, load_json

__all__ = [  # ParsedAction, ToolCallParser, MAX_CALLS_PER_TURN and load_json live in forge_env.tools.parsed
    "MAX_CALLS_PER_TURN",
    "ParsedAction",
    "ToolCallParser",
    "detect_parser",
    "format_hermes_call",
    "get_parser",
    "guarded",
    "load_json",
    "parse_tool_calls",
    "parser_names",
]


# ----------------------------------------------------------------------------- registry

def parser_names() -> list[str]:
    """The names :func:`get_parser` knows."""
    return sorted(formats.PARSERS)


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    """Look up a tool-call parser by name (see :func:`parser_names`), or pass a callable through guarded."""
    if callable(name):
        return guarded(name)
    try:
        return guarded(formats.PARSERS[name])
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
                f"the tool calls could not be parsed ({type(exc).__name__}: {str(exc)[:QUOTE_CHARS]})"])
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
    return formats.detect(chat_template or "")


def format_hermes_call(name: str, arguments: dict) -> str:
    """Render one call the way a Hermes/Qwen model writes it (used by expert demonstrations)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

