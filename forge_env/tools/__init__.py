"""Tools for environments: the ``@tool`` decorator and tool-call parsers."""

from forge_env.tools.parsers import (
    ParsedAction,
    detect_parser,
    format_hermes_call,
    get_parser,
    parse_tool_calls,
    parser_names,
)
from forge_env.tools.tool import InfraError, Tool, ToolArgumentError, ToolError, json_schema_for, tool

__all__ = [
    "InfraError",
    "ParsedAction",
    "Tool",
    "ToolArgumentError",
    "ToolError",
    "detect_parser",
    "format_hermes_call",
    "get_parser",
    "json_schema_for",
    "parse_tool_calls",
    "parser_names",
    "tool",
]
