"""Cost of serving an environment over the network: ``forge-env serve`` vs EnvService vs in-process.

One step is a calculator tool call in ``forge_env/Arithmetic-v0`` (cheap, so the numbers show the serving
overhead rather than the environment's work). With 1, 16 and 128 concurrent sessions it measures, in one run,
step latency p50/p99 (every step of every session) and steps per second for:

- the in-process ``TextEnv`` (the baseline);
- a ``RemoteEnv`` of an ``EnvService`` on Monarch (``--replicas`` processes);
- ``OpenEnvTextEnv`` clients over WebSockets to ``forge-env serve`` (a separate process, same replicas).

    python -m benchmarks.serve_bench [--steps 2000] [--replicas 2] [--concurrency 1 16 128]

``--sessions N`` measures capacity instead (:mod:`benchmarks.serve_capacity`): N sessions held open and stepped
once each in a burst, with p50/p99 step latency, sessions served and server memory per idle session.

    python -m benchmarks.serve_bench --sessions 2048 [--env forge_env/ToolUse-v0 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import forge_env
from forge_env.openenv import OpenEnvTextEnv
from forge_env.services import EnvService
from forge_env.types import assistant_message, make_tool_call

ENV_ID = "forge_env/Arithmetic-v0"
ENV_KWARGS = {"max_turns": 1_000_000}
ACTION = assistant_message("", [make_tool_call("calculator", {"expression": "23+45*2"}, "call_0")])
WARMUP_STEPS = 5


async def run_sessions(make_env: Callable[[], Any], sessions: int, steps_per_session: int) -> tuple[np.ndarray, float]:
    """Per-step latencies (ms) of all sessions stepping concurrently, and the steps per second they reached."""
    envs = [make_env() for _ in range(sessions)]
    for i, env in enumerate(envs):
        await env.areset(seed=i)
        for _ in range(WARMUP_STEPS):
            await env.astep(ACTION)
    latencies = np.empty((sessions, steps_per_session))

    async def run(index: int, env: Any) -> None:
        for step in range(steps_per_session):
            started = time.perf_counter()
            await env.astep(ACTION)
            latencies[index, step] = (time.perf_counter() - started) * 1000.0

    started = time.perf_counter()
    await asyncio.gather(*(run(i, env) for i, env in enumerate(envs)))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(env.aclose() for env in envs))
    return latencies.ravel(), sessions * steps_per_session / elapsed


async def start_server(replicas: int, max_sessions: int, *, env_id: str = ENV_ID, extra: tuple[str, ...] = ()
                       ) -> tuple[asyncio.subprocess.Process, str, str]:
    """``forge-env serve`` in a subprocess; returns it, its ws URL and its ready line."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agents.cli", "serve", env_id, "--kwargs", json.dumps(ENV_KWARGS), "--port", "0",
        "--replicas", str(replicas), "--max-sessions", str(max_sessions), *extra, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    while True:
        line = (await process.stdout.readline()).decode()
        if not line:
            raise RuntimeError("forge-env serve exited before it was ready")
        if " on http://" in line:
            return process, line.split(" on ", 1)[1].split()[0], line.strip()


async def main(steps: int, replicas: int, concurrency: list[int]) -> None:
    print(f"serve benchmark: {ENV_ID}, one step = one calculator tool call, {replicas} replica(s), "
          f"{steps} steps per row")
    server, url, _ = await start_server(replicas, max(concurrency))
    try:
        async with await EnvService.launch(ENV_ID, num_replicas=replicas, max_episodes_per_replica=max(concurrency),
                                           env_kwargs=ENV_KWARGS) as service:
            paths: dict[str, Callable[[], Any]] = {
                "in-process": lambda: forge_env.make(ENV_ID, **ENV_KWARGS),
                "EnvService": service.env,
                "forge-env serve": lambda: OpenEnvTextEnv(url),
            }
            print(f"\n  {'sessions':>8}  {'path':<16} {'p50 ms':>8} {'p99 ms':>8} {'steps/s':>9} {'vs in-process':>14}")
            for sessions in concurrency:
                per_session = max(steps // sessions, 10)
                base_rate = None
                for name, make_env in paths.items():
                    latencies, rate = await run_sessions(make_env, sessions, per_session)
                    base_rate = base_rate or rate
                    print(f"  {sessions:>8}  {name:<16} {np.percentile(latencies, 50):>8.2f} "
                          f"{np.percentile(latencies, 99):>8.2f} {rate:>9.0f} {rate / base_rate:>13.2f}x")
    finally:
        server.terminate()
        await server.wait()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per row (split over the sessions)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--sessions", type=int, default=None,
                        help="capacity mode: hold this many sessions open and step each once")
    parser.add_argument("--env", nargs="+", default=["forge_env/Arithmetic-v0", "forge_env/ToolUse-v0"],
                        help="environments of the capacity mode")
    parser.add_argument("--profile", action="store_true",
                        help="capacity mode: sample the server with py-spy and print where its time goes")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if args.sessions is not None:
        from benchmarks.serve_capacity import main as capacity_main

        asyncio.run(capacity_main(args.env, args.sessions, args.replicas, profile=args.profile))
    else:
        asyncio.run(main(args.steps, args.replicas, args.concurrency))
