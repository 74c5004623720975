"""Where one EnvService step's time goes: timestamps taken in the caller and inside the replica, and CPU time.

Used by ``env_service_bench.py --breakdown``. Module level (not in the benchmark's ``__main__``), so the
replica processes can import :class:`TracedEnvServer`.

Timestamps are ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux: one clock for every process of the machine),
so a stamp taken in the replica and one taken in the caller can be subtracted. A step is cut into hops:

- ``client before send``: RemoteEnv.astep -> service routing, session check, replica slot -> the call;
- ``send``: pickling the message and posting it (Monarch's ``call_one`` up to its return, or the write on the
  replica's direct channel);
- ``to the actor``: from there until the endpoint starts running in the replica (transport, unpickling,
  dispatch on the actor's loop);
- ``actor, around env``: the endpoint's own work outside ``TextEnv.astep`` (episode lookup, counters);
- ``env step``: ``TextEnv.astep`` in the replica (what the in-process baseline also pays);
- ``reply``: from the endpoint's return until the caller's await of the Monarch future returns (pickling the
  result, transport, waking the caller's loop);
- ``client after reply``: from there until ``astep`` returns to its caller.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from forge_env.services import EnvServer, concurrent_endpoint

HOPS = ("client before send", "send", "to the actor", "actor, around env", "env step", "reply",
        "client after reply")


class TracedEnvServer(EnvServer):
    """EnvServer whose ``step`` stamps its entry, the env step's start and end, and its exit (``trace()``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stamps: list[tuple[float, float, float, float]] = []

    @concurrent_endpoint
    async def step(self, session_id: str, action: Any) -> tuple[list, float, bool, bool, dict]:
        entered = time.perf_counter()
        episode = self.episodes.get(session_id)
        if episode is None:
            return await EnvServer.step._method.__wrapped__(self, session_id, action)  # its error, unchanged
        self.counters["steps"] += 1
        episode.busy += 1
        try:
            started = time.perf_counter()
            result = await episode.env.astep(action)
            ended = time.perf_counter()
            return result
        finally:
            episode.busy -= 1
            episode.last_used = time.monotonic()
            self.stamps.append((entered, started, ended, time.perf_counter()))

    @concurrent_endpoint
    async def trace(self) -> list[tuple[float, float, float, float]]:
        """The stamps recorded since the last ``trace()`` (and forget them)."""
        stamps, self.stamps = self.stamps, []
        return stamps


class _TimedEndpoint:
    def __init__(self, port: Any, log: list[tuple[float, float, float]]) -> None:
        self._port = port
        self._log = log

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        before = time.perf_counter()
        future = self._port.call_one(*args, **kwargs)
        sent = time.perf_counter()
        try:
            return await future
        finally:
            self._log.append((before, sent, time.perf_counter()))

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        return await self._port.call(*args, **kwargs)


class TimedMesh:
    """Stands in for a replica's Monarch actor mesh and stamps each ``call_one``: (before, sent, answered)."""

    def __init__(self, mesh: Any) -> None:
        self._mesh = mesh
        self.log: list[tuple[float, float, float]] = []

    def __getattr__(self, name: str) -> Any:
        return _TimedEndpoint(getattr(self._mesh, name), self.log)


class TimedChannel:
    """Stands in for a replica's direct channel and stamps each call: (before, written, answered)."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.log: list[tuple[float, float, float]] = []
        self._written = 0.0
        write = channel.outbox._write

        def stamped_write(data: bytes) -> None:
            write(data)
            self._written = time.perf_counter()

        channel.outbox._write = stamped_write

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        before = time.perf_counter()
        try:
            return await self._channel.call(*args, **kwargs)
        finally:
            self.log.append((before, self._written, time.perf_counter()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


async def breakdown(step: Callable[[], Awaitable[Any]], mesh: TimedMesh | TimedChannel,
                    trace: Callable[[], Awaitable[Any]], steps: int) -> dict[str, Any]:
    """Run ``step`` ``steps`` times alone and cut each into :data:`HOPS` (medians and means, microseconds)."""
    await trace()
    mesh.log.clear()
    outer = []
    for _ in range(steps):
        started = time.perf_counter()
        await step()
        outer.append((started, time.perf_counter()))
    inner = await trace()
    sends = [entry for entry in mesh.log if entry[0] >= outer[0][0]]
    if not (len(inner) == len(sends) == steps):
        raise RuntimeError(f"breakdown: {steps} steps, {len(sends)} Monarch calls, {len(inner)} actor stamps "
                           "(a step was not one call)")
    rows = []
    for (c0, c4), (c1, c2, c3), (a0, e0, e1, a1) in zip(outer, sends, inner, strict=True):
        rows.append((c1 - c0, c2 - c1, a0 - c2, (e0 - a0) + (a1 - e1), e1 - e0, c3 - a1, c4 - c3))
    import numpy as np

    table = np.array(rows) * 1e6
    return {"median_us": dict(zip(HOPS, np.median(table, axis=0), strict=True)),
            "mean_us": dict(zip(HOPS, table.mean(axis=0), strict=True)),
            "total_median_us": float(np.median([(c4 - c0) * 1e6 for c0, c4 in outer]))}


# ----------------------------------------------------------------------------- CPU time of a process tree
def _ticks(pid: int) -> tuple[float, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[1])


def tree_pids(root: int | None = None) -> list[int]:
    """``root`` (default: this process) and every live descendant (whichever thread forked it)."""
    root = os.getpid() if root is None else root
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _ticks(int(name))
            if info is not None:
                parents.setdefault(info[1], []).append(int(name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(parents.get(pid, []))
    return found


def tree_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) of each of ``pids`` (those still alive)."""
    out = {}
    for pid in pids:
        info = _ticks(pid)
        if info is not None:
            out[pid] = info[0]
    return out


class CpuMeter:
    """CPU seconds the process tree spends between ``start()`` and ``stop()``: this process, and the rest."""

    def start(self) -> None:
        self.pids = tree_pids()
        self.before = tree_cpu(self.pids)
        self.own_before = time.process_time()

    def stop(self) -> tuple[float, float]:
        own = time.process_time() - self.own_before
        after = tree_cpu(self.pids)
        others = sum(after[p] - self.before.get(p, 0.0) for p in after if p != os.getpid())
        return own, others
