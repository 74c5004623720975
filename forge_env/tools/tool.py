"""Tools an environment offers the model.

``@tool`` turns a plain (sync or async) Python function into a :class:`Tool`: its
JSON schema comes from the signature's type hints and the docstring (a Google-style
``Args:`` section gives per-argument descriptions). Calling a tool validates and
coerces the model's arguments first, so a wrong call becomes a readable
:class:`ToolArgumentError` instead of a crash inside the function.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from forge_env.errors import InfraError
from forge_env.types import ToolSpec

__all__ = ["InfraError", "Tool", "ToolArgumentError", "ToolError", "json_schema_for", "tool"]


class ToolError(Exception):
    """Raised by a tool to report a failure the model should read (the message is shown verbatim)."""


class ToolArgumentError(ToolError):
    """The model called a tool with arguments that do not match its schema."""


_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def json_schema_for(annotation: Any) -> dict[str, Any]:
    """JSON schema of a Python type annotation (str/int/float/bool, list/dict, Optional, Literal)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _PRIMITIVES:
        return {"type": _PRIMITIVES[annotation]}
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        values = list(args)
        kind = _PRIMITIVES.get(type(values[0]))
        return {"type": kind, "enum": values} if kind else {"enum": values}
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return json_schema_for(non_null[0])
        return {"anyOf": [json_schema_for(a) for a in non_null]}
    if annotation is list or origin is list:
        schema: dict[str, Any] = {"type": "array"}
        if args:
            schema["items"] = json_schema_for(args[0])
        return schema
    if annotation is dict or origin is dict:
        return {"type": "object"}
    raise TypeError(f"@tool cannot describe the annotation {annotation!r}; use str, int, float, bool, list, dict, Literal or Optional")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its summary text and the per-argument descriptions of an ``Args:`` section."""
    doc = inspect.cleandoc(doc or "")
    match = re.search(r"^\s*(Args|Arguments|Parameters):\s*$", doc, flags=re.MULTILINE)
    if not match:
        return doc.strip(), {}
    summary = doc[: match.start()].strip()
    described: dict[str, str] = {}
    current = None
    for line in doc[match.end():].splitlines():
        if re.match(r"^\s*(Returns|Raises|Yields|Examples?):\s*$", line):
            break
        item = re.match(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
        if item:
            current = item.group(1)
            described[current] = item.group(3).strip()
        elif current and line.strip():
            described[current] += " " + line.strip()
    return summary, described


_CHECKS: dict[Any, Callable[[Any], bool]] = {
    None: lambda v: True,
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _coerce(value: Any, schema: dict[str, Any], where: str) -> Any:
    """Check ``value`` against a (small subset of) JSON schema, coercing ints to floats where a number is expected."""
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _coerce(value, option, where)
            except ToolArgumentError:
                continue
        raise ToolArgumentError(f"{where}: {value!r} matches none of the allowed types")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolArgumentError(f"{where}: {value!r} is not one of {schema['enum']}")
    kind = schema.get("type")
    if isinstance(kind, list):  # JSON schema allows {"type": ["integer", "null"]}
        return _coerce(value, {"anyOf": [{**schema, "type": k} for k in kind]}, where)
    if kind not in _CHECKS:  # a schema keyword we do not check here (e.g. from an MCP server): the tool validates
        return value
    ok = _CHECKS[kind]
    if not ok(value):
        # Models often write whole numbers as 3.0 for integer parameters.
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            return int(value)
        raise ToolArgumentError(f"{where}: expected {kind}, got {type(value).__name__} {value!r}")
    if kind == "array" and "items" in schema:
        return [_coerce(item, schema["items"], f"{where}[{i}]") for i, item in enumerate(value)]
    return value


@dataclass
class Tool:
    """A callable tool with its OpenAI-style spec. Build one with :func:`tool`."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout: float | None = None
    timeout_is_infra: bool = False
    """The tool enforces its own deadline inside (a sandbox's wall clock) and ``timeout`` adds a grace:
    a call that still outlives ``timeout`` was held up by the machine, so it raises :class:`InfraError`."""
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)

    @property
    def spec(self) -> ToolSpec:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Return the arguments checked against the schema, or raise ToolArgumentError saying what is wrong."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"{self.name}: arguments must be a JSON object, got {type(arguments).__name__}")
        properties = self.parameters.get("properties", {})
        unknown = sorted(set(arguments) - set(properties))
        if unknown and not self.parameters.get("additionalProperties", False):
            raise ToolArgumentError(f"{self.name}: unknown argument(s) {unknown}; expected {sorted(properties)}")
        missing = [name for name in self.parameters.get("required", []) if name not in arguments]
        if missing:
            raise ToolArgumentError(f"{self.name}: missing required argument(s) {missing}")
        return {
            key: _coerce(value, properties.get(key, {}), f"{self.name}.{key}") for key, value in arguments.items()
        }

    async def __call__(self, **arguments: Any) -> Any:
        """Validate the arguments and run the tool (sync tools run in a worker thread)."""
        checked = self.validate(arguments)
        if self.is_async:
            return await self.fn(**checked)
        return await asyncio.to_thread(self.fn, **checked)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Decorator turning a function into a :class:`Tool`; usable bare (``@tool``) or with options."""

    def build(func: Callable[..., Any]) -> Tool:
        summary, arg_docs = _docstring_parts(func.__doc__ or "")
        hints = typing.get_type_hints(func)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in inspect.signature(func).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"@tool {func.__name__}: *args/**kwargs cannot be described as a JSON schema")
            schema = json_schema_for(hints.get(param.name, param.annotation))
            if param.name in arg_docs:
                schema["description"] = arg_docs[param.name]
            properties[param.name] = schema
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
        parameters = {"type": "object", "properties": properties, "required": required}
        return Tool(name or func.__name__, description or summary, parameters, func, timeout)

    return build(fn) if fn is not None else build

