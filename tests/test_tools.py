"""@tool schemas and argument checks, and the Hermes tool-call parser."""

from typing import Literal

import pytest

from forge_env.tools import ToolArgumentError, parse_tool_calls, tool


@tool
def search(query: str, limit: int = 5, mode: Literal["fast", "deep"] = "fast", tags: list[str] | None = None) -> str:
    """Search the collection.

    Args:
        query: what to look for.
        limit: how many results
            to return at most.
    """
    return f"{query}:{limit}:{mode}:{tags}"


def test_schema_from_signature_and_docstring():
    spec = search.spec
    assert spec["function"]["name"] == "search"
    assert spec["function"]["description"] == "Search the collection."
    params = spec["function"]["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {"type": "string", "description": "what to look for."}
    assert params["properties"]["limit"] == {"type": "integer", "description": "how many results to return at most."}
    assert params["properties"]["mode"] == {"type": "string", "enum": ["fast", "deep"]}
    assert params["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}


async def test_call_validates_and_coerces():
    assert await search(query="x", limit=2.0) == "x:2:fast:None"
    with pytest.raises(ToolArgumentError, match="search.limit: expected integer"):
        await search(query="x", limit=2.5)
    with pytest.raises(ToolArgumentError, match="not one of"):
        await search(query="x", mode="slow")
    with pytest.raises(ToolArgumentError, match=r"tags\[1\]: expected string"):
        await search(query="x", tags=["a", 3])
    with pytest.raises(ToolArgumentError, match="expected integer, got bool"):
        await search(query="x", limit=True)


def test_unsupported_annotation_is_a_clear_error():
    with pytest.raises(TypeError, match="cannot describe"):
        @tool
        def bad(x: set) -> str:
            return ""


def test_hermes_parser():
    text = 'Let me check.<tool_call>{"name": "search", "arguments": {"query": "cats"}}</tool_call>' \
           '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"dogs\\"}"}</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me check."
    assert [c["function"]["arguments"] for c in parsed.tool_calls] == ['{"query": "cats"}', '{"query": "dogs"}']
    assert parsed.errors == []


def test_hermes_parser_reports_errors_and_unclosed_blocks():
    parsed = parse_tool_calls('<tool_call>{"name": "a"}</tool_call><tool_call>{"nom": 1}</tool_call><tool_call>{bad')
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["a"]
    assert len(parsed.errors) == 2
    assert 'must be an object like {"name"' in parsed.errors[0]
    assert "not valid JSON" in parsed.errors[1]
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        parse_tool_calls("x", parser="nope")


async def test_foreign_schemas_with_null_type_lists_and_unknown_types():
    from forge_env.tools import Tool

    async def echo(**arguments):
        return arguments

    parameters = {"type": "object", "required": ["n"], "properties": {
        "n": {"type": ["integer", "null"]},
        "tag": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "when": {"type": "date-time-ish"},  # not a JSON type we check: the tool itself validates it
    }}
    foreign = Tool("echo", "Echo.", parameters, echo)
    assert await foreign(n=None, tag=None, when="today") == {"n": None, "tag": None, "when": "today"}
    assert await foreign(n=3.0, tag="x") == {"n": 3, "tag": "x"}
    with pytest.raises(ToolArgumentError, match="echo.n: .* matches none of the allowed types"):
        await foreign(n="three")
    with pytest.raises(ToolArgumentError, match="echo.tag"):
        await foreign(n=1, tag=5)
