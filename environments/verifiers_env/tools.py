"""A verifiers ``vf.Toolset`` as forge-env tools.

verifiers serves each toolset as an MCP server (``python -m <module>``, streamable HTTP, started per rollout
for ``Task.toolsets`` and once for ``Taskset.toolsets``) and the chat harness advertises its tools as
``<server>_<tool>`` (bare when the toolset sets ``TOOL_PREFIX = None``). Here the same ``@vf.tool`` methods are
registered on an in-process ``mcp`` ``MCPServer``: the schemas the model sees and the argument validation are
the MCP SDK's, as on verifiers' own server, without a subprocess, a port or verifiers' uv-script harness
(which needs the network). The tools run the environment's own code, as forge-env's ``@tool`` functions do.

Toolset state (``self.state``, a ``vf.State`` subclass) lives on the episode's trace: verifiers syncs it
through an HTTP channel (pull before a call, push after, whole-state replacement, last write wins); the
adapter makes the same JSON round trip in memory, so a reward reading ``trace.state`` sees what tools wrote.
"""

from __future__ import annotations

import json
from typing import Any

from forge_env.tools import Tool, ToolError
from forge_env.tools.mcp import result_text


class SharedState:
    """The episode's ``trace.state``: tools read and replace it (see the module docstring); every trace the
    adapter records for the episode carries it."""

    def __init__(self, state: Any):
        self.state = state

    async def call(self, server: Any, fn: Any, arguments: dict[str, Any]) -> Any:
        """Run ``fn`` with the server's view of the trace state, then write the state back, as the channel does."""
        from pydantic import TypeAdapter
        from verifiers.v1.mcp.server import _call_state  # the contextvar ServerBase.state reads
        from verifiers.v1.state import State

        if server._state_cls is State:  # verifiers syncs only State subclasses: base State has no fields
            token = _call_state.set(State())
            try:
                result = fn(**arguments)
                return await result if hasattr(result, "__await__") else result
            finally:
                _call_state.reset(token)
        trace_adapter = TypeAdapter(type(self.state))
        before = trace_adapter.dump_json(self.state)
        state = server._state_adapter.validate_json(before)
        token = _call_state.set(state)
        try:
            result = fn(**arguments)
            if hasattr(result, "__await__"):
                result = await result
        finally:
            _call_state.reset(token)
        after = server._state_adapter.dump_json(state)
        if after != before:
            self.state = trace_adapter.validate_json(after)
        return result


def _registered(server: Any, fn: Any, holder: SharedState) -> Any:
    import functools
    import inspect

    @functools.wraps(fn)
    async def with_state(*args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        return await holder.call(server, fn, dict(bound.arguments))

    with_state.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]  # MCP reads the parameters
    return with_state


def forge_tools(servers: list[Any], holder: SharedState) -> list[Tool]:
    """The tools of ``servers`` (vf.Toolset instances) as forge-env :class:`Tool` objects sharing ``holder``.

    Each server's ``@vf.tool`` methods go on an in-process ``MCPServer`` (which validates and runs the calls);
    the schemas are the MCP SDK's ``Tool.from_function`` ones, the same that ``MCPServer.list_tools`` serves.
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools import Tool as MCPTool
    from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content
    from verifiers.v1.utils.decorators import discover_decorated

    tools: list[Tool] = []
    for server in servers:
        mcp = MCPServer(server.server_name or type(server).__name__)
        for fn in discover_decorated(server, "tool"):
            raw_name = getattr(fn, "tool_name", None) or fn.__name__
            description = (fn.__doc__ or "").strip() or None
            registered = _registered(server, fn, holder)
            mcp.add_tool(registered, name=raw_name, description=description)
            listed = MCPTool.from_function(registered, name=raw_name, description=description)
            name = f"{server.server_name}_{raw_name}" if server.server_name else raw_name
            tools.append(Tool(name, listed.description or "", _object_schema(listed.parameters),
                              _caller(mcp, raw_name, mcp_content_to_chat_content)))
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:  # verifiers' harness refuses the same clash ("keep MCP tool names qualified")
        raise ValueError(f"verifiers toolsets advertise duplicate tool names {duplicates}")
    return tools


def _caller(mcp: Any, raw_name: str, to_chat: Any) -> Any:
    async def call_verifiers_tool(**arguments: Any) -> str:
        from mcp.server.mcpserver.exceptions import ToolError as MCPToolError

        try:
            result = await mcp.call_tool(raw_name, arguments)
        except MCPToolError as exc:  # bad arguments or the tool raised: the model reads it, as over MCP
            raise ToolError(str(exc)) from None
        content = to_chat(result.content)
        return content if isinstance(content, str) else result_text(result)

    return call_verifiers_tool


def _object_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    schema = json.loads(json.dumps(schema or {}))
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema
