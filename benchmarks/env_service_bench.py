"""Cost of serving an environment: in-process TextEnv vs the same env behind an EnvService.

One step is a calculator tool call in ``forge_env/Arithmetic-v0`` (cheap, so the numbers
show the serving overhead rather than the environment's own work). In one run it measures:

- step latency p50/p99 with one episode stepping sequentially: in-process (the baseline),
  behind an EnvService on the local backend (the service layer alone), and on Monarch
  (real replica processes), plus the round trip of a no-op endpoint (Monarch's floor).
  The four are measured interleaved, step by step, so load from other processes hits
  them alike; the overhead is the median of the paired differences (target: <= 1 ms);
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
WARMUP = 20

Factory = Callable[[], Any]


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000.0


async def interleaved_latencies(probes: dict[str, Callable[[], Awaitable[Any]]], steps: int) -> dict[str, np.ndarray]:
    """Milliseconds per call of each probe, taking turns call by call (after a warm-up)."""
    for _ in range(WARMUP):
        for probe in probes.values():
            await probe()
    times = {name: np.empty(steps) for name in probes}
    for i in range(steps):
        for name, probe in probes.items():
            times[name][i] = await timed(probe)
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
    await asyncio.gather(*(env.aclose() for env in envs))
    return sessions * steps_per_session / elapsed


def local_env() -> Any:
    return forge_env.make(ENV_ID, **ENV_KWARGS)


async def latency_section(steps: int, local_service: EnvService, monarch: EnvService, replicas: int) -> None:
    envs = {"in-process TextEnv": local_env(), "EnvService, local backend": local_service.env(),
            f"EnvService, Monarch x{replicas}": monarch.env()}
    for env in envs.values():
        await env.areset(seed=0)
    probes: dict[str, Callable[[], Awaitable[Any]]] = {
        name: (lambda env=env: env.astep(ACTION)) for name, env in envs.items()}
    probes["no-op endpoint, Monarch"] = monarch.service.stats.route
    times = await interleaved_latencies(probes, steps)
    base_name, _, remote_name, floor_name = list(probes)
    base = times[base_name]
    print(f"\nStep latency, one episode stepping sequentially ({steps} steps each, interleaved):")
    for name, values in times.items():
        p50, p99 = np.percentile(values, 50), np.percentile(values, 99)
        extra = ""
        if name not in (base_name, floor_name):
            extra = f"   overhead {np.median(values - base):+.3f} ms (median of paired differences)"
        print(f"  {name:<28} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms{extra}")
    overhead = float(np.median(times[remote_name] - base))
    verdict = "meets" if overhead <= 1.0 else "misses"
    print(f"  -> Monarch overhead {overhead:.3f} ms per step ({verdict} the 1 ms target); Monarch's own round trip "
          f"here is {np.median(times[floor_name]):.3f} ms")
    for env in envs.values():
        await env.aclose()


async def main(steps: int, replicas: int, concurrency: list[int], total_steps: int) -> None:
    print(f"EnvService benchmark: {ENV_ID}, one step = one calculator tool call")
    async with await EnvService.launch(ENV_ID, backend="local", env_kwargs=ENV_KWARGS) as local_service, \
            await EnvService.launch(ENV_ID, num_replicas=replicas, max_episodes_per_replica=max(concurrency),
                                    env_kwargs=ENV_KWARGS) as monarch:
        await latency_section(steps, local_service, monarch, replicas)
        print(f"\nThroughput, steps/s ({total_steps} steps per row, {replicas} Monarch replicas):")
        print(f"  {'sessions':>8}  {'in-process':>12}  {'EnvService':>12}  {'ratio':>6}")
        for sessions in concurrency:
            per_session = max(total_steps // sessions, 10)
            local_rate = await throughput(local_env, sessions, per_session)
            remote_rate = await throughput(monarch.env, sessions, per_session)
            print(f"  {sessions:>8}  {local_rate:>12.0f}  {remote_rate:>12.0f}  {remote_rate / local_rate:>6.2f}")
        metrics = monarch.metrics()
        print(f"\nService metrics: {metrics.requests} calls, p50 {metrics.latency_p50_ms:.3f} ms, "
              f"p99 {metrics.latency_p99_ms:.3f} ms, failures {metrics.failures}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps for the latency rows")
    parser.add_argument("--replicas", type=int, default=2, help="EnvService replicas (processes)")
    parser.add_argument("--total-steps", type=int, default=4000, help="steps per throughput row")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    asyncio.run(main(args.steps, args.replicas, args.concurrency, args.total_steps))
