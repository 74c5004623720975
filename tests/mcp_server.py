"""A small MCP server for the adapter's tests, run as a subprocess over stdio.

Tools: ``add`` (typed arguments), ``greet`` (an optional argument), ``fail`` (an error
result), ``slow`` (sleeps, for timeouts), ``pid`` (to check the process is gone after
close) and ``die`` (exits the process, to simulate a crash).
"""

import asyncio
import logging
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

logging.disable(logging.CRITICAL)  # keep the test output free of the server's per-call log lines
app = MCPServer("forge-env-test-server")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def greet(name: str, greeting: str | None = None) -> str:
    """Greet someone."""
    return f"{greeting or 'Hello'}, {name}!"


@app.tool()
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ToolError(message)


@app.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "done"


@app.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@app.tool()
def die() -> str:
    """Exit the server process at once."""
    os._exit(1)


if __name__ == "__main__":
    app.run("stdio")
