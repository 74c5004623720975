"""The MCP adapter against a real MCP server (tests/mcp_server.py) run as a subprocess over stdio."""

import asyncio
import os
import pathlib
import sys

import pytest

from forge_env import ToolEnv, ToolError, check_env
from forge_env.tools import format_hermes_call
from forge_env.tools.mcp import MCPStartupError, MCPToolset

SERVER = str(pathlib.Path(__file__).with_name("mcp_server.py"))
TASKS = [{"question": "What is 2 + 3?", "answer": "5"}, {"question": "What is 4 + 4?", "answer": "8"}]


def call(tool_name, **arguments):
    return format_hermes_call(tool_name, arguments)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def toolset():
    """One server for the module, started from sync code (it lives on the SDK's background loop)."""
    with MCPToolset(sys.executable, [SERVER], include=["add", "greet", "fail", "slow", "pid"]) as started:
        yield started


def test_lists_tools_with_their_json_schemas(toolset):
    specs = {t.name: t.spec["function"] for t in toolset.tools}
    assert list(specs) == ["add", "greet", "fail", "slow", "pid"]  # "die" was not included
    assert specs["add"]["description"] == "Add two integers."
    parameters = specs["add"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["a", "b"]
    assert parameters["properties"]["a"]["type"] == "integer"
    assert specs["greet"]["parameters"]["required"] == ["name"]
    assert specs["pid"]["parameters"] == {"type": "object", "properties": {}}


async def test_env_round_trips_calls_in_order_with_errors(toolset):
    env = ToolEnv(tools=toolset.tools, tasks=TASKS, tool_timeout=10)
    await env.areset(options={"task": TASKS[0]})
    observation, _, _, _, info = await env.astep(
        call("add", a=2, b=3) + call("fail", message="nope") + call("greet", name="Bo", greeting=None)
        + call("add", a="two", b=3) + call("greet", name="Al", greeting="Hi"))
    assert [m["content"] for m in observation] == [
        "5",
        "Error: Error executing tool fail: nope",
        "Hello, Bo!",
        "Error: add.a: expected integer, got str 'two'",
        "Hi, Al!",
    ]
    assert [m["name"] for m in observation] == ["add", "fail", "greet", "add", "greet"]
    assert info["tool_errors"] == 2
    *_, reward, terminated, _, info = await env.astep("Answer: 5")
    assert reward == 1.0 and terminated and info["metrics"]["tool_calls"] == 5


async def test_timed_out_call_does_not_block_the_server(toolset):
    env = ToolEnv(tools=toolset.tools, tasks=TASKS, tool_timeout=0.3)
    await env.areset(seed=0)
    observation, *_ = await env.astep(call("slow", seconds=30) + call("add", a=1, b=1))
    assert observation[0]["content"] == "Error: tool slow timed out after 0.3 s"
    assert observation[1]["content"] == "2"
    observation, *_ = await env.astep(call("add", a=2, b=2))
    assert observation[0]["content"] == "4"


def test_check_env_passes_with_mcp_tools(toolset):
    check_env(lambda: ToolEnv(tools=toolset.tools, tasks=TASKS, max_turns=3))


async def test_async_lifecycle_crash_and_clean_shutdown():
    async with MCPToolset(sys.executable, [SERVER], prefix="t_") as toolset:
        assert toolset.running and "t_die" in [t.name for t in toolset.tools]
        pid = int(await toolset.call("pid"))
        assert _alive(pid)
        by_name = {t.name: t for t in toolset.tools}
        assert await by_name["t_add"](a=20, b=22) == "42"
        with pytest.raises(ToolError, match="MCP tool die failed"):
            await toolset.call("die")
        with pytest.raises(ToolError, match="MCP tool add failed"):
            await toolset.call("add", {"a": 1, "b": 2})
    assert not toolset.running
    for _ in range(50):  # the dead server is reaped by the SDK's shutdown
        if not _alive(pid):
            break
        await asyncio.sleep(0.1)
    assert not _alive(pid)
    with pytest.raises(ToolError, match="not running"):
        await toolset.call("add", {"a": 1, "b": 2})
    await toolset.aclose()  # closing twice is fine


async def test_close_stops_a_healthy_server():
    toolset = MCPToolset(sys.executable, [SERVER])
    await toolset.astart()
    pid = int(await toolset.call("pid"))
    await toolset.aclose()
    assert not _alive(pid)


async def test_startup_failures_are_clear():
    with pytest.raises(MCPStartupError, match="failed to start"):
        await MCPToolset(sys.executable, ["-c", "import sys; sys.exit(3)"]).astart()
    with pytest.raises(MCPStartupError, match="failed to start"):
        await MCPToolset("/nonexistent/mcp-server").astart()
    with pytest.raises(MCPStartupError, match="did not start within 0.5 s"):
        await MCPToolset(sys.executable, ["-c", "import time; time.sleep(30)"], startup_timeout=0.5).astart()
    with pytest.raises(ValueError, match=r"has no tool\(s\) \['nope'\]"):
        async with MCPToolset(sys.executable, [SERVER], include=["add", "nope"]):
            pass


async def test_an_mcp_without_client_is_named_at_once(monkeypatch):
    """mcp 1.x (pulled in by other packages) has no ``Client``: say so, do not wait out the startup timeout."""
    import mcp

    monkeypatch.delattr(mcp, "Client")
    with pytest.raises(MCPStartupError, match=r"mcp package >= 2"):
        await MCPToolset(sys.executable, [SERVER], startup_timeout=20).astart()


async def test_sync_step_inside_the_loop_that_opened_the_toolset():
    """A notebook: the toolset is opened with ``await`` on the running loop, then the sync API is used there."""
    async with MCPToolset(sys.executable, [SERVER], include=["add"]) as toolset:
        env = ToolEnv(tools=toolset.tools, tasks=TASKS, tool_timeout=10)
        env.reset(options={"task": TASKS[0]})
        observation, *_ = env.step(call("add", a=2, b=3))  # blocks this loop while the env runs
        assert observation[0]["content"] == "5"
        env.close()


async def test_running_turns_false_when_the_server_dies():
    async with MCPToolset(sys.executable, [SERVER]) as toolset:
        assert toolset.running
        with pytest.raises(ToolError):
            await toolset.call("die")
        for _ in range(100):
            if not toolset.running:
                break
            await asyncio.sleep(0.1)
        assert not toolset.running
