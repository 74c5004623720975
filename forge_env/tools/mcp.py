"""MCP tools: run a Model Context Protocol server over stdio and offer its tools to an environment.

:class:`MCPToolset` starts the server as a subprocess, lists its tools and wraps each as a
:class:`~forge_env.tools.Tool` whose JSON schema is the server's ``inputSchema``, so a
``ToolEnv(tools=toolset.tools, ...)`` can use them like ``@tool`` functions::

    async with MCPToolset(sys.executable, ["my_server.py"]) as toolset:
        env = ToolEnv(tools=[*toolset.tools, calculator], tasks=tasks)

or, from sync code, ``toolset = MCPToolset(...).start()`` ... ``toolset.close()``.

A result the server flags as an error (``isError``) and a failed call (server gone, protocol
error, timeout) raise :class:`~forge_env.tools.ToolError`, which the environment shows the
model as an error message. The connection lives in one task of the SDK's background loop
(the MCP SDK's anyio scopes must be entered and left by the same task), whichever loop
started it; calls and ``aclose`` from any other loop are forwarded there, so a sync
``env.step`` called from inside a running loop (a notebook) never waits on the loop it blocks. Closing stops the server:
its stdin is closed, then it is terminated and, if it lingers, killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Collection, Coroutine, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from forge_env.tools.tool import Tool, ToolError
from forge_env.utils.aio import background_loop, run_sync

logger = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_LIST_PAGES = 100


class MCPStartupError(RuntimeError):
    """The MCP server could not be started or did not complete the handshake."""


class MCPToolset:
    """The tools of one MCP server, run as a subprocess speaking MCP over stdio.

    Args:
        command: the executable that starts the server (e.g. ``sys.executable`` or ``"npx"``).
        args: its command-line arguments.
        env: extra environment variables for the server (merged over a minimal safe environment).
        cwd: the server's working directory.
        prefix: prepended to every tool name (to keep several servers' tools apart, e.g. ``"fs_"``).
        include: only these tools (server names, without ``prefix``); all tools by default.
        startup_timeout: seconds to wait for the server to start and list its tools.
        call_timeout: seconds one call may take before it fails (the env's ``tool_timeout`` applies too).
        errlog: where the server's stderr goes (a file with a ``fileno``; default ``sys.stderr``).
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        prefix: str = "",
        include: Collection[str] | None = None,
        startup_timeout: float = 30.0,
        call_timeout: float | None = None,
        errlog: TextIO | None = None,
    ):
        self.command = command
        self.args = [str(a) for a in args]
        self.env = env
        self.cwd = cwd
        self.prefix = prefix
        self.include = set(include) if include is not None else None
        self.startup_timeout = startup_timeout
        self.call_timeout = call_timeout
        self.errlog = errlog
        self.tools: list[Tool] = []
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._read_stream: Any = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"MCPToolset({' '.join([self.command, *self.args])!r}, {state}, tools={[t.name for t in self.tools]})"

    @property
    def running(self) -> bool:
        """Whether the server connection is up: started, not closed, and the server still answering.

        A server that exited (crashed, killed) closes its stdout; the transport's read
        stream then has no writer left, and the toolset reports itself stopped.
        """
        if self._client is None or self._runner is None or self._runner.done():
            return False
        statistics = getattr(self._read_stream, "statistics", None)
        return statistics is None or statistics().open_send_streams > 0

    # ----------------------------------------------------------------- lifecycle
    async def astart(self) -> list[Tool]:
        """Start the server, list its tools and return them (also kept in :attr:`tools`).

        The connection always lives on the SDK's background loop, whichever loop calls
        this: a notebook that opened the toolset on its own loop and then calls the sync
        ``env.step`` (which blocks that loop) still gets its tool calls answered.
        """
        owner = background_loop()
        if asyncio.get_running_loop() is not owner:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._astart_here(), owner))
        return await self._astart_here()

    async def _astart_here(self) -> list[Tool]:
        if self._runner is not None:
            raise RuntimeError(f"{self!r} is already started; close() it before starting again")
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ready: asyncio.Future = self._loop.create_future()
        self._runner = asyncio.create_task(self._serve(ready), name=f"mcp:{self.command}")
        try:
            # Also wake when the runner ends without answering: an error it raised before the
            # handshake must surface at once with its real cause, not as a startup timeout.
            await asyncio.wait({ready, self._runner}, timeout=self.startup_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():
                if self._runner.done() and not self._runner.cancelled() and self._runner.exception() is not None:
                    cause = self._runner.exception()
                    raise MCPStartupError(f"MCP server {self._command_line()!r} failed to start: "
                                          f"{_describe(cause)}") from cause
                raise MCPStartupError(f"MCP server {self._command_line()!r} did not start within "
                                      f"{self.startup_timeout:g} s; check that it speaks MCP over stdio "
                                      "(its stderr shows why)")
            listed = ready.result()
        except BaseException:
            await self._abandon()
            raise
        try:
            self.tools = self._wrap(listed)
        except BaseException:
            await self.aclose()
            raise
        return self.tools

    async def aclose(self) -> None:
        """Stop the server and wait for it to exit. Safe to call twice, and from another event loop."""
        runner, loop = self._runner, self._loop
        if runner is None or loop is None:
            return
        if asyncio.get_running_loop() is not loop:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.aclose(), loop))
            return
        assert self._stop is not None
        self._stop.set()
        try:
            await runner
        except Exception as exc:  # a server that crashed earlier can fail its shutdown too; it is gone either way
            logger.warning("MCP server %r did not shut down cleanly: %s", self._command_line(), _describe(exc))
        finally:
            self._runner = None
            self._client = None

    def start(self) -> MCPToolset:
        """Sync :meth:`astart` (on the SDK's background loop); returns self."""
        run_sync(self.astart())
        return self

    def close(self) -> None:
        """Sync :meth:`aclose`."""
        run_sync(self.aclose())

    async def __aenter__(self) -> MCPToolset:
        await self.astart()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __enter__(self) -> MCPToolset:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ----------------------------------------------------------------- calls
    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> str:
        """Call a server tool by its server name; return its text, or raise ToolError if it failed."""
        return await self._on_own_loop(self._call(name, arguments or {}))

    async def _call(self, name: str, arguments: dict[str, Any]) -> str:
        client = self._client
        if client is None:
            raise ToolError(f"the MCP server for {name} is not running (closed, crashed or never started)")
        try:
            result = await client.call_tool(name, arguments, read_timeout_seconds=self.call_timeout)
        except TimeoutError:
            raise ToolError(f"MCP tool {name} did not answer within {self.call_timeout:g} s") from None
        except Exception as exc:  # the SDK raises several types for a dead server or a protocol error
            raise ToolError(f"MCP tool {name} failed: {type(exc).__name__}: {exc or 'connection lost'}") from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"MCP tool {name} reported an error")
        return text

    async def _on_own_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop that owns the connection, from whichever loop we are on."""
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            return await coro
        if loop.is_closed():
            coro.close()
            raise ToolError("the MCP server's event loop is closed; start the toolset again")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    # ----------------------------------------------------------------- internals
    async def _serve(self, ready: asyncio.Future) -> None:
        """Own the client for its whole life: connect, list tools, wait for the stop signal, disconnect."""
        try:
            Client, StdioServerParameters, stdio_client = _mcp_client_api()
            parameters = StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
            transport = self._watched(stdio_client(parameters, errlog=self.errlog or sys.stderr))
            async with Client(transport) as client:
                listed = await _list_all_tools(client)
                self._client = client
                ready.set_result(listed)
                assert self._stop is not None
                await self._stop.wait()
        except Exception as exc:
            if ready.done():
                raise
            ready.set_exception(MCPStartupError(f"MCP server {self._command_line()!r} failed to start: "
                                                f"{_describe(exc)}"))
        except BaseException:
            ready.cancel()  # a no-op once ready; keeps an abandoned start from leaving an unread error behind
            raise
        finally:
            self._client = None
            self._read_stream = None

    @contextlib.asynccontextmanager
    async def _watched(self, transport: Any):
        """The transport, keeping its read stream at hand so :attr:`running` can see the server go."""
        async with transport as streams:
            self._read_stream = streams[0]
            yield streams

    async def _abandon(self) -> None:
        """Cancel a runner that never became ready, and forget it."""
        runner = self._runner
        self._runner = None
        if runner is not None and not runner.done():
            runner.cancel()
        if runner is not None:
            try:
                await runner
            except (asyncio.CancelledError, Exception):
                pass

    def _command_line(self) -> str:
        return " ".join([self.command, *self.args])

    def _wrap(self, listed: list[Any]) -> list[Tool]:
        names = [t.name for t in listed]
        if self.include is not None:
            unknown = sorted(self.include - set(names))
            if unknown:
                raise ValueError(f"MCP server {self._command_line()!r} has no tool(s) {unknown}; it offers {names}")
        return [self._tool_for(t) for t in listed if self.include is None or t.name in self.include]

    def _tool_for(self, listed: Any) -> Tool:
        server_name = listed.name
        toolset = self

        async def call_mcp_tool(**arguments: Any) -> str:
            return await toolset.call(server_name, arguments)

        return Tool(self.prefix + server_name, listed.description or "", _object_schema(listed.input_schema),
                    call_mcp_tool, timeout=None)


def _mcp_client_api() -> tuple[Any, Any, Any]:
    """``mcp.Client``, ``StdioServerParameters`` and ``stdio_client``, or a clear error naming the version needed."""
    try:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError as exc:
        installed = _installed_version("mcp")
        raise MCPStartupError(f"forge-env's MCP tools need the mcp package >= 2 (mcp.Client); installed: "
                              f"{installed or 'none'} ({exc}). Install it with: pip install 'mcp>=2'") from exc
    return Client, StdioServerParameters, stdio_client


def _installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


async def _list_all_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(_MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _describe(exc: BaseException) -> str:
    """An exception's message, looking inside the exception groups that anyio task groups raise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _object_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The server's input schema as a tool's parameters: always ``type: object`` with ``properties``."""
    schema = dict(schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    schema.pop("title", None)  # pydantic's "fooArguments" title is noise in a prompt
    return schema


def result_text(result: Any) -> str:
    """Text for the model from an MCP ``CallToolResult``: text blocks as they are, other blocks named."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}]".replace(" ]", "]"))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)
