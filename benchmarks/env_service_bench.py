"""Cost of serving an environment: in-process TextEnv vs the same env behind an EnvService.

One step is a calculator tool call in ``forge_env/Arithmetic-v0`` (cheap, so the numbers
show the serving overhead rather than the environment's own work). In one run it measures:

- step latency p50/p99 with one episode stepping sequentially: in-process (the baseline),
  behind an EnvService on the local backend (service layer only), and on Monarch
  (real replica processes), with the Monarch overhead over in-process (target: p50 <= 1 ms);
- steps per second with 1, 16 and 128 concurrent episodes, in-process vs on Monarch.

    python -m benchmarks.env_service_bench [--steps 2000] [--replicas 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import forge_env
from forge_env.services import EnvService
from forge_env.types import assistant_message, make_tool_call

ENV_ID = "forge_env/Arithmetic-v0"
ENV_KWARGS = {"max_turns": 100_000}
ACTION = assistant_message("", [make_tool_call("calculator", {"expression": "23+45*2"}, "call_0")])

Factory = Callable[[], Any]


async def step_latencies(env: Any, steps: int) -> np.ndarray:
    """Seconds per ``astep`` for one episode stepping sequentially (after a short warm-up)."""
    await env.areset(seed=0)
    for _ in range(20):
        await env.astep(ACTION)
    times = np.empty(steps)
    for i in range(steps):
        started = time.perf_counter()
        await env.astep(ACTION)
        times[i] = time.perf_counter() - started
    return times


async def throughput(make_env: Factory, sessions: int, steps_per_session: int) -> float:
    """Steps per second with ``sessions`` episodes stepping concurrently."""
    envs = [make_env() for _ in range(sessions)]
    await asyncio.gather(*(env.areset(seed=i) for i, env in enumerate(envs)))

    async def run(env: Any) -> None:
        for _ in range(steps_per_session):
            await env.astep(ACTION)

    started = time.perf_counter()
    await asyncio.gather(*(run(env) for env in envs))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(close(env) for env in envs))
    return sessions * steps_per_session / elapsed


async def close(env: Any) -> None:
    await env.aclose()


def local_env() -> Any:
    return forge_env.make(ENV_ID, **ENV_KWARGS)


async def latency_row(label: str, make_env: Factory, steps: int, baseline: float | None) -> float:
    env = make_env()
    times = await step_latencies(env, steps) * 1000.0
    await close(env)
    p50, p99 = float(np.percentile(times, 50)), float(np.percentile(times, 99))
    extra = "" if baseline is None else f"   overhead p50 {p50 - baseline:+.3f} ms ({p50 / baseline:.1f}x)"
    print(f"  {label:<28} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms{extra}")
    return p50


async def main(steps: int, replicas: int, concurrency: list[int], total_steps: int) -> None:
    print(f"EnvService benchmark: {ENV_ID}, one step = one calculator tool call")
    print(f"\nStep latency, one episode stepping sequentially ({steps} steps):")
    base = await latency_row("in-process TextEnv", local_env, steps, None)
    async with await EnvService.launch(ENV_ID, backend="local", env_kwargs=ENV_KWARGS) as envs:
        await latency_row("EnvService, local backend", envs.env, steps, base)
    async with await EnvService.launch(ENV_ID, num_replicas=replicas, max_episodes_per_replica=max(concurrency),
                                       env_kwargs=ENV_KWARGS) as envs:
        remote = await latency_row(f"EnvService, Monarch x{replicas}", envs.env, steps, base)
        verdict = "meets" if remote - base <= 1.0 else "misses"
        print(f"  -> Monarch overhead p50 {remote - base:.3f} ms per step ({verdict} the 1 ms target)")

        print(f"\nThroughput, steps/s ({total_steps} steps per row, {replicas} Monarch replicas):")
        print(f"  {'sessions':>8}  {'in-process':>12}  {'EnvService':>12}  {'ratio':>6}")
        for sessions in concurrency:
            per_session = max(total_steps // sessions, 10)
            local_rate = await throughput(local_env, sessions, per_session)
            remote_rate = await throughput(envs.env, sessions, per_session)
            print(f"  {sessions:>8}  {local_rate:>12.0f}  {remote_rate:>12.0f}  {remote_rate / local_rate:>6.2f}")
        metrics = envs.metrics()
        print(f"\nService metrics: {metrics.requests} calls, p50 {metrics.latency_p50_ms:.3f} ms, "
              f"p99 {metrics.latency_p99_ms:.3f} ms, failures {metrics.failures}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps for the latency rows")
    parser.add_argument("--replicas", type=int, default=2, help="EnvService replicas (processes)")
    parser.add_argument("--total-steps", type=int, default=4000, help="steps per throughput row")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    return parser.parse_args(argv)


def run(argv: list[str] | None = None, runner: Callable[[Awaitable[None]], None] = asyncio.run) -> None:
    args = parse_args(argv)
    runner(main(args.steps, args.replicas, args.concurrency, args.total_steps))


if __name__ == "__main__":
    run()
