"""Actors used by the service tests. Module level, so replica processes can import them."""

from __future__ import annotations

import asyncio
import os

from forge_env.services import ForgeActor, concurrent_endpoint, endpoint


class Echo(ForgeActor):
    """Stateless: says who it is; can sleep, fail with an application error, or die."""

    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag
        self.ready = False
        self.calls = 0

    @endpoint
    async def setup(self) -> None:
        self.ready = True

    @endpoint
    async def whoami(self) -> dict:
        self.calls += 1
        return {"pid": os.getpid(), "ready": self.ready, "tag": self.tag, "calls": self.calls}

    @endpoint
    async def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    async def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    async def die(self, after_s: float = 0.0) -> None:
        await asyncio.sleep(after_s)
        raise SystemExit(3)

    @endpoint
    async def cuda_visible(self) -> str | None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")


class SlowEcho(ForgeActor):
    """Concurrent endpoints that sleep, to keep calls in flight (for queueing and kill-mid-call tests)."""

    @concurrent_endpoint
    async def nap(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return os.getpid()

    @concurrent_endpoint
    async def pid(self) -> int:
        return os.getpid()

    @concurrent_endpoint
    async def die(self, after_s: float = 0.0) -> None:
        await asyncio.sleep(after_s)
        raise SystemExit(3)

    @concurrent_endpoint
    async def square(self, value: int) -> int:
        if value < 0:
            raise ValueError(f"negative: {value}")
        return value * value


class Counter(ForgeActor):
    """Stateful per session: ``incr`` counts per session id; ``end`` forgets a session."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.ended: list[str] = []

    @endpoint
    async def incr(self, session_id: str | None = None) -> tuple[int, int]:
        key = session_id or "-"
        self.counts[key] = self.counts.get(key, 0) + 1
        return os.getpid(), self.counts[key]

    @endpoint
    async def end(self, session_id: str) -> None:
        self.counts.pop(session_id, None)
        self.ended.append(session_id)

    @endpoint
    async def state(self) -> dict:
        return {"counts": dict(self.counts), "ended": list(self.ended)}


class SyncEcho(ForgeActor):
    """Sync endpoints only (Monarch runs them on the actor's thread)."""

    @endpoint
    def setup(self) -> None:
        self.base = 10

    @endpoint
    def add(self, x: int) -> int:
        return self.base + x

    @endpoint
    def block(self, seconds: float) -> float:
        """Hold the actor's thread (as a train step does): no ping is answered meanwhile."""
        import time

        time.sleep(seconds)
        return seconds


class BrokenSetup(ForgeActor):
    @endpoint
    async def setup(self) -> None:
        raise RuntimeError("model file missing")

    @endpoint
    async def ping(self) -> str:
        return "pong"


class GpuProbe(ForgeActor):
    """Reports the CUDA device its process sees (GPU tests only)."""

    @endpoint
    async def device_name(self) -> str:
        import torch

        return torch.cuda.get_device_name(0)


class FlakySetup(ForgeActor):
    """Local-backend only: every second instance fails its setup; instances record their cleanup."""

    built: list[FlakySetup] = []

    def __init__(self) -> None:
        self.cleaned = False
        FlakySetup.built.append(self)

    @endpoint
    async def setup(self) -> None:
        if len(FlakySetup.built) % 2 == 0 and FlakySetup.built[-1] is self:
            raise RuntimeError("flaky setup")

    @endpoint
    async def ping(self) -> str:
        return "pong"

    async def __cleanup__(self, exc: Exception | None) -> None:
        self.cleaned = True
