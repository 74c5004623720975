"""Costs of tool use: ToolUse-v0 expert episodes, and MCP tool calls against in-process tools.

Measured in one run:

- ToolUse-v0 expert episodes per second per difficulty (task generation, search/read,
  calculator, scoring; all in-process), with the ratio to hops=1;
- one tool call through ``TextEnv.astep``: an in-process ``@tool`` (the baseline) against
  the same tool served by an MCP server over stdio (``MCPToolset``): p50 latency and ratio;
- a turn of 8 parallel calls to the MCP tool against 8 turns of one call (the concurrency
  gain of answering a parallel turn at once).

    python -m benchmarks.tool_use_bench [--episodes 200] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import sys
import tempfile
import time

from environments.tool_use.env import ToolUseEnv
from forge_env import ToolEnv, tool
from forge_env.tools import format_hermes_call
from forge_env.tools.mcp import MCPToolset

SERVER = '''
import logging
from mcp.server.mcpserver import MCPServer
logging.disable(logging.CRITICAL)
app = MCPServer("bench")

@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b

app.run("stdio")
'''


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def expert_episodes_per_second(hops: int, episodes: int) -> float:
    env = ToolUseEnv(hops=hops, distractors=4)
    started = time.perf_counter()
    for seed in range(episodes):
        await env.areset(seed=seed)
        done = False
        while not done:
            *_, terminated, truncated, _ = await env.astep(env.expert_action())
            done = terminated or truncated
    return episodes / (time.perf_counter() - started)


async def call_latencies(env: ToolEnv, calls: int, per_turn: int = 1) -> list[float]:
    await env.areset(seed=0)
    action = "".join(format_hermes_call("add", {"a": i, "b": 1}) for i in range(per_turn))
    latencies = []
    for _ in range(calls):
        started = time.perf_counter()
        observation, *_ = await env.astep(action)
        latencies.append(time.perf_counter() - started)
        assert not observation[0]["content"].startswith("Error"), observation
    return latencies


async def main(episodes: int, calls: int) -> None:
    print("ToolUse-v0 expert episodes (in-process, distractors=4)")
    base = None
    for hops in (1, 2, 3, 4):
        rate = await expert_episodes_per_second(hops, episodes)
        base = base or rate
        print(f"  hops={hops}: {rate:8.1f} episodes/s   ({rate / base:.2f}x hops=1)")

    tasks = [{"question": "What is 1 + 1?", "answer": "2"}]
    local = ToolEnv(tools=[add], tasks=tasks, max_turns=10**6)
    with tempfile.TemporaryDirectory() as scratch:
        script = pathlib.Path(scratch) / "bench_server.py"
        script.write_text(SERVER)
        async with MCPToolset(sys.executable, [str(script)]) as toolset:
            remote = ToolEnv(tools=toolset.tools, tasks=tasks, max_turns=10**6)
            await call_latencies(remote, 20)  # warm up the server
            in_process = statistics.median(await call_latencies(local, calls))
            over_mcp = statistics.median(await call_latencies(remote, calls))
            print("One tool call through env.astep (p50)")
            print(f"  in-process @tool: {in_process * 1e6:8.0f} us")
            print(f"  MCP over stdio:   {over_mcp * 1e6:8.0f} us   ({over_mcp / in_process:.1f}x in-process)")
            one_by_one = sum(await call_latencies(remote, 8))
            parallel = sum(await call_latencies(remote, 1, per_turn=8))
            print("8 MCP calls")
            print(f"  8 turns of 1 call: {one_by_one * 1e3:7.1f} ms")
            print(f"  1 turn of 8 calls: {parallel * 1e3:7.1f} ms   ({one_by_one / parallel:.1f}x faster)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--calls", type=int, default=200)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.episodes, arguments.calls))
