"""One replica as the service sees it: its backend handle, health, queue and counters.

A backend handle (Monarch process mesh or in-process instance) only knows how to call
an endpoint, report its pids, watch for its own death and stop. Health, the
concurrency limit with its FIFO queue, one call through that queue (:meth:`Replica.invoke`)
and per-replica counters live here, the same for every backend.

Not built on the worker-pool core the sandbox and verifier pools share (:mod:`forge_env.sandbox.slots`),
because a replica's semantics differ: it serves up to ``limit`` calls at once (a worker there serves one),
it has no per-call deadline that kills it (a slow call is the endpoint's business), its death fails every
call queued on it and cancels every call in flight (there, a worker's failure is its one request's alone),
and it is respawned by the service's health monitor with backoff, not by the next caller.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from forge_env.services.errors import ReplicaFailedError, ServiceOverloadedError

ReplicaState = Literal["starting", "healthy", "unhealthy", "stopped"]


class ReplicaDown(Exception):
    """Raised by a backend handle when the replica died under a call (never by user code: it is private to services)."""


class ReplicaHandle(Protocol):
    """What a backend gives the service for one running replica."""

    pids: list[int]

    async def call(self, endpoint: str, args: tuple, kwargs: dict) -> Any:
        """Run ``endpoint``; re-raise the endpoint's own exception; raise ``ReplicaDown`` if the replica died."""
        ...

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Arrange for ``on_death(reason)`` to run on the current loop when the replica dies."""
        ...

    async def stop(self) -> None:
        """Stop the replica; safe to call on a dead one."""
        ...


class Slots:
    """A concurrency limit with a FIFO queue whose waiters can all be failed at once (when the replica dies)."""

    def __init__(self, limit: int, max_queue: int | None) -> None:
        self.limit = limit
        self.max_queue = max_queue
        self.in_use = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self.waiters)

    async def acquire(self, who: str) -> None:
        if self.in_use < self.limit and not self.waiters:
            self.in_use += 1
            return
        if self.max_queue is not None and len(self.waiters) >= self.max_queue:
            raise ServiceOverloadedError(
                f"{who}: {self.in_use} calls in flight and {len(self.waiters)} queued (max_queue_per_replica="
                f"{self.max_queue}); retry later, add replicas or raise the limits")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter  # release() hands its slot over by resolving this future
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # the slot was handed over just as we were cancelled: pass it on
            elif waiter in self.waiters:
                self.waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_use -= 1

    def fail_waiters(self, make_error: Callable[[], BaseException]) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(make_error())


@dataclass
class ReplicaStats:
    """Counters of one replica (reset never; they survive respawns)."""

    requests: int = 0
    errors: int = 0
    failures: int = 0
    respawns: int = 0


class Replica:
    """A slot in the service: index ``i`` keeps its identity while its handle is replaced on respawn."""

    def __init__(self, index: int, limit: int, max_queue: int | None) -> None:
        self.index = index
        self.limit = limit
        self.max_queue = max_queue
        self.handle: ReplicaHandle | None = None
        self.state: ReplicaState = "starting"
        self.generation = 0
        self.slots = Slots(limit, max_queue)
        self.calls: set[asyncio.Task[Any]] = set()  # the tasks awaiting a call on this replica
        self.killed: set[asyncio.Task[Any]] = set()  # those fail() cancelled
        self.sessions = 0
        self.last_failure = ""
        self.stats = ReplicaStats()

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"

    @property
    def load(self) -> int:
        """Calls in flight plus calls queued: what least-loaded routing minimises."""
        return self.slots.in_use + self.slots.queued

    def attach(self, handle: ReplicaHandle) -> None:
        """A freshly spawned handle takes over this slot (new generation, empty queue)."""
        self.handle = handle
        self.generation += 1
        self.slots = Slots(self.limit, self.max_queue)
        self.calls = set()
        self.killed = set()
        self.sessions = 0
        self.state = "healthy"

    def fail(self, reason: str, service_name: str) -> None:
        """Mark dead: fail queued calls and cancel calls in flight (their callers see ``ReplicaFailedError``)."""
        self.state = "unhealthy"
        self.last_failure = reason
        self.stats.failures += 1
        self.slots.fail_waiters(lambda: ReplicaFailedError(
            f"{service_name} replica {self.index} failed: {reason}", replica=self.index, reason=reason))
        for task in list(self.calls):
            self.killed.add(task)
            task.cancel()

    async def invoke(self, endpoint: str, args: tuple, kwargs: dict, service_name: str,
                     on_down: Callable[[Replica, int, str], None]) -> Any:
        """One call: wait for a slot, run it, count it. The endpoint's own exception is re-raised (and counted
        in ``stats.errors``); ``ReplicaFailedError`` if the replica dies (a handle that reports it down also
        calls ``on_down(replica, generation, reason)``, so the service marks it dead at once)."""
        handle, generation = self.handle, self.generation
        self.stats.requests += 1
        slots = self.slots
        if slots.in_use < slots.limit and not slots.waiters:  # a free slot: no await, no future
            slots.in_use += 1
        else:
            await slots.acquire(f"{service_name} replica {self.index}")
        try:
            if self.generation != generation or not self.healthy or handle is None:
                raise ReplicaFailedError(f"{service_name} replica {self.index} failed: {self.last_failure}", replica=self.index,
                                         reason=self.last_failure)
            # The call runs in the caller's task (no task of its own: one hop less per call); fail() cancels
            # that task, and the cancellation it caused is taken back here and becomes ReplicaFailedError.
            task = asyncio.current_task()
            assert task is not None
            calls, killed = self.calls, self.killed
            calls.add(task)
            try:
                try:
                    result = await handle.call(endpoint, args, kwargs)
                finally:
                    calls.discard(task)
                if task in killed:  # the handle swallowed fail()'s cancellation: the replica is dead all the same
                    raise asyncio.CancelledError
                return result
            except asyncio.CancelledError:
                if task in killed:
                    killed.discard(task)
                    if task.uncancel() == 0:  # only fail() cancelled it; the caller did not
                        raise ReplicaFailedError(f"{service_name} replica {self.index} failed during {endpoint}(): {self.last_failure}",
                                                 replica=self.index, reason=self.last_failure) from None
                raise
            except ReplicaDown as down:
                on_down(self, generation, str(down))
                raise ReplicaFailedError(f"{service_name} replica {self.index} failed during {endpoint}(): {down}", replica=self.index,
                                         reason=str(down)) from None
            except Exception:
                self.stats.errors += 1
                raise
        finally:
            slots.release()
