"""Capacity of one ``forge-env serve``: N concurrent WebSocket sessions opened from one process.

    python -m benchmarks.serve_bench --sessions 2048 [--env forge_env/ToolUse-v0] [--replicas 2]

It starts the server (``--max-sessions N``), raises this process's own open-file limit (the benchmark's, not the
product's: the server raises its own), opens N sockets and resets an episode on each (the sessions are then idle),
measures the server process tree's RSS before and after (the growth divided by N is the memory per idle session),
then sends a burst of one step per session at once and reports step latency p50/p99 and how many sessions were
served. It prints the CPU model and the load average, since both move the figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.serve_bench import start_server
from forge_env.types import assistant_message, make_tool_call

ACTIONS = {
    "forge_env/Arithmetic-v0": assistant_message("", [make_tool_call("calculator", {"expression": "23+45*2"}, "c0")]),
    "forge_env/ToolUse-v0": assistant_message("", [make_tool_call("search", {"query": "population"}, "c0")]),
}
OPENING = 64  # connections being opened at once


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    return f"unknown CPU ({os.cpu_count()} CPUs)"


def load_average() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def raise_own_file_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise SystemExit(f"the open-file limit here is {soft} (hard); {needed} sockets need more (ulimit -Hn)")
    return soft


def tree_rss_kb(pid: int) -> tuple[int, int]:
    """Resident memory (KiB, from /proc) of ``pid`` and of every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    own, total, todo = 0, 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    own = own or total
        except OSError:
            pass
    return own, total - own


async def request(ws: Any, frame: dict[str, Any]) -> dict[str, Any]:
    await ws.send(json.dumps(frame))
    return json.loads(await ws.recv())


async def run_capacity(env_id: str, sessions: int, replicas: int, extra: list[str] | None = None,
                       profile: str | None = None) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    files = raise_own_file_limit(sessions + 64)
    server, url, ready = await start_server(replicas, sessions, env_id=env_id, extra=tuple(extra or ()))
    sockets: list[Any] = []
    try:
        await asyncio.sleep(1.0)
        before = tree_rss_kb(server.pid)
        gate = asyncio.Semaphore(OPENING)

        async def open_one(index: int) -> Any:
            async with gate:
                # websockets' defaults, as OpenEnv's and forge-env's clients use them (permessage-deflate offered)
                ws = await connect(url.replace("http://", "ws://") + "/ws", max_size=None, open_timeout=120,
                                   ping_interval=None, proxy=None)
                reply = await request(ws, {"type": "reset", "data": {"seed": index}})
                if reply.get("type") != "observation":
                    raise RuntimeError(f"session {index}: reset answered {str(reply)[:200]}")
                return ws

        started = time.perf_counter()
        sockets = list(await asyncio.gather(*(open_one(i) for i in range(sessions))))
        open_s = time.perf_counter() - started
        await asyncio.sleep(2.0)
        after = tree_rss_kb(server.pid)
        profiler = None
        if profile:  # the burst only: what a step costs the server
            profiler = await asyncio.create_subprocess_exec(
                "py-spy", "record", "-p", str(server.pid), "-f", "raw", "-o", profile, "-r", "200", "--nonblocking",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            await asyncio.sleep(1.0)
        action = ACTIONS[env_id]
        step = {"type": "step", "data": {k: action[k] for k in ("content", "tool_calls") if k in action}}
        burst_started = time.perf_counter()

        async def step_one(ws: Any) -> float | None:
            sent = time.perf_counter()
            reply = await request(ws, step)
            return (time.perf_counter() - sent) * 1000.0 if reply.get("type") == "observation" else None

        results = await asyncio.gather(*(step_one(ws) for ws in sockets), return_exceptions=True)
        burst_s = time.perf_counter() - burst_started
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            await profiler.wait()
        latencies = np.array([r for r in results if isinstance(r, float)])
        return {"env_id": env_id, "sessions": sessions, "replicas": replicas, "served": len(latencies),
                "p50_ms": float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
                "p99_ms": float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
                "burst_steps_per_s": len(latencies) / burst_s, "open_s": open_s,
                "kb_per_idle_session": (sum(after) - sum(before)) / sessions,
                "server_kb_per_session": (after[0] - before[0]) / sessions,
                "replicas_kb_per_session": (after[1] - before[1]) / sessions,
                "rss_before_mb": sum(before) / 1024, "rss_after_mb": sum(after) / 1024, "client_file_limit": files, "server": ready}
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
        server.terminate()
        await server.wait()


def top_frames(raw_profile: str, count: int = 12) -> list[tuple[float, str]]:
    """The functions with the most samples at the top of the stack in a py-spy ``raw`` (collapsed) profile."""
    self_samples: dict[str, int] = {}
    total = 0
    for line in Path(raw_profile).read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        frame = stack.split(";")[-1]
        self_samples[frame] = self_samples.get(frame, 0) + int(samples)
        total += int(samples)
    ranked = sorted(self_samples.items(), key=lambda item: -item[1])[:count]
    return [(100.0 * n / max(total, 1), frame) for frame, n in ranked]


async def main(env_ids: list[str], sessions: int, replicas: int, extra: list[str] | None = None,
               profile: bool = False) -> None:
    print(f"serve capacity: {sessions} WebSocket sessions from one process, {replicas} replica(s)")
    print(f"CPU: {cpu_model()}; {load_average()} at start")
    for env_id in env_ids:
        raw = f"/tmp/serve_capacity_{os.getpid()}_{env_id.split('/')[-1]}.txt" if profile else None
        row = await run_capacity(env_id, sessions, replicas, extra, raw)
        print(f"\n{env_id}: {row['server']}")
        print(f"  served {row['served']}/{sessions} sessions; burst of one step each: p50 {row['p50_ms']:.0f} ms, "
              f"p99 {row['p99_ms']:.0f} ms, {row['burst_steps_per_s']:.0f} steps/s")
        print(f"  server tree RSS {row['rss_before_mb']:.0f} -> {row['rss_after_mb']:.0f} MB: "
              f"{row['kb_per_idle_session']:.1f} KB per idle session (connected and reset: "
              f"{row['server_kb_per_session']:.1f} in the server process, {row['replicas_kb_per_session']:.1f} in "
              f"the replicas); opening took {row['open_s']:.1f} s")
        if raw is not None and Path(raw).exists():
            print("  where the server process spent its time (py-spy, the burst, % of samples on top):")
            for share, frame in top_frames(raw):
                print(f"    {share:5.1f}%  {frame[:110]}")
        print(f"  {load_average()}")
