"""The worker-pool core: a fixed number of slots, each holding a replaceable worker process; and ``SlotGate``.

The sandbox pool (:class:`forge_env.sandbox.pool.PooledSandbox`) and the math verifier pool
(``environments.math.verify.VerifierPool``) both keep a few long-lived worker processes, hand each request
to one of them under a deadline, and kill and replace a worker that passes its deadline, dies or answers
garbage. What they share lives here:

* **Slots.** A pool has ``size`` slots; a :class:`Slot` holds a worker or nothing. A caller takes a slot
  (FIFO when all are busy: that is the backpressure), from a coroutine (:meth:`WorkerSlots.take`) or from a
  thread (:meth:`WorkerSlots.take_sync`), uses its worker, and gives the slot back (:meth:`~WorkerSlots.give`).
  The slot, not the worker, is what is queued, so a worker's death never loses a place in the pool.
* **Ready before use.** ``ensure`` makes the slot's worker usable: a worker that is no longer usable (dead,
  or outdated) is detached and killed, an empty slot gets a freshly spawned worker.
* **Replace on failure.** A worker that failed is ``detach``-ed from its slot and killed by the pool that
  saw the failure (it knows how: the sandbox's workers close asynchronously, the verifier's are killed from
  its threads). ``replace`` does both and, with ``respawn="eager"``, starts the successor at once (the
  verifier: its workers import sympy for seconds, better done while idle); with ``respawn="lazy"`` the next
  taker starts it (the sandbox).
* **Spawn failure keeps the slot.** When no worker can be spawned (the machine refuses a process), the slot
  stays empty and goes back to the queue: the spawn error reaches the caller that tried, and the next taker
  tries again. A pool with one slot never waits for ever on a worker that was never started.
* **Closing.** ``close`` marks the pool closed, fails every waiting ``take`` with the pool's own closed
  error, and returns the workers still attached for the caller to kill; a worker spawned while the pool
  closed is killed instead of attached.
* **Live workers.** ``live`` is the set of attached workers (for monitoring and a last-resort kill).

Spawning and killing are the pool's own callables, coroutines for :class:`AsyncWorkerSlots` and blocking
calls for :class:`ThreadWorkerSlots`; the two drivers are the only code written twice. Counting (stats) is
the pool's business too: its ``spawn`` and ``kill`` callables count what they do.

It lives in the sandbox package because that package stands alone (its one dependency is
``forge_env.errors``: it runs under a bare system Python, as an unprivileged user, see
``tests/test_sandbox.py``); the verifier pool imports it from here. ``forge_env.services.replica`` is not
built on this: a replica serves many calls at once, is health-checked and respawned by the service with
backoff, and its death fails every queued and running call; here a worker serves one request at a time and
its failure is the request's alone.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, Literal, TypeVar

W = TypeVar("W")

__all__ = ["AsyncWorkerSlots", "Slot", "SlotGate", "ThreadWorkerSlots", "WorkerSlots"]


class SlotGate:
    """A FIFO semaphore handing out objects, usable from any thread and any event loop.

    ``acquire`` waits on a future of the caller's own loop; ``acquire_sync`` blocks the calling thread;
    ``release`` wakes the longest waiter (through its loop's ``call_soon_threadsafe``), or puts the object
    back when nobody waits. ``fail_waiters`` raises an error in every current waiter.
    """

    def __init__(self, items: list) -> None:
        self._free = collections.deque(items)
        # (loop, asyncio future) for coroutines, (None, concurrent future) for threads
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop | None, asyncio.Future
                                               | concurrent.futures.Future]] = collections.deque()
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self):
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free and not self._waiters:
                return self._free.popleft()
            future = loop.create_future()
            self._waiters.append((loop, future))
        try:
            return await future
        except asyncio.CancelledError:
            with self._lock:
                try:
                    self._waiters.remove((loop, future))
                except ValueError:
                    pass  # already handed an item: _deliver gives it back
            raise

    def acquire_sync(self):
        """Blocking ``acquire`` for threads (never call it on an event loop)."""
        with self._lock:
            if self._free and not self._waiters:
                return self._free.popleft()
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._waiters.append((None, future))
        return future.result()

    def release(self, item) -> None:
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                if loop is None:
                    if future.set_running_or_notify_cancel():
                        future.set_result(item)
                        return
                elif not loop.is_closed():
                    loop.call_soon_threadsafe(self._deliver, future, item)
                    return
            self._free.append(item)

    def fail_waiters(self, make_error: Callable[[], BaseException]) -> None:
        """Raise ``make_error()`` in everyone waiting now (the pool closed)."""
        with self._lock:
            waiters, self._waiters = list(self._waiters), collections.deque()
        for loop, future in waiters:
            if loop is None:
                if future.set_running_or_notify_cancel():
                    future.set_exception(make_error())
            elif not loop.is_closed():
                loop.call_soon_threadsafe(self._fail, future, make_error())

    def _deliver(self, future: asyncio.Future, item) -> None:
        if future.done():  # cancelled in the meantime
            self.release(item)
        else:
            future.set_result(item)

    @staticmethod
    def _fail(future: asyncio.Future, error: BaseException) -> None:
        if not future.done():
            future.set_exception(error)


class Slot(Generic[W]):
    """A place in the pool: it keeps its identity while the worker in it is replaced."""

    __slots__ = ("worker",)

    def __init__(self) -> None:
        self.worker: W | None = None


class WorkerSlots(Generic[W]):
    """The state both drivers share: slots, their FIFO gate, the live workers, closing (module docstring).

    ``usable(worker)`` says whether an attached worker may take the next request (alive, not outdated);
    ``closed_error()`` builds the error a ``take`` raises once the pool is closed.
    """

    def __init__(self, size: int, *, usable: Callable[[W], bool], closed_error: Callable[[], BaseException],
                 respawn: Literal["lazy", "eager"] = "lazy") -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"a worker pool needs at least one slot, got {size!r}")
        if respawn not in ("lazy", "eager"):
            raise ValueError(f"respawn must be 'lazy' or 'eager', got {respawn!r}")
        self.size = size
        self.slots: list[Slot[W]] = [Slot() for _ in range(size)]
        self.live: set[W] = set()
        self.closed = False
        self.respawn = respawn
        self._usable = usable
        self._closed_error = closed_error
        self._gate = SlotGate(list(self.slots))
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot."""
        return self._gate.waiting

    def check_open(self) -> None:
        if self.closed:
            raise self._closed_error()

    def _taken(self, slot: Slot[W]) -> Slot[W]:
        if self.closed:
            self._gate.release(slot)
            self.check_open()
        return slot

    async def take(self) -> Slot[W]:
        """A slot (waiting in FIFO order while all are busy); the pool's closed error once it is closed."""
        self.check_open()
        return self._taken(await self._gate.acquire())

    def take_sync(self) -> Slot[W]:
        """``take`` for threads: blocks the calling thread."""
        self.check_open()
        return self._taken(self._gate.acquire_sync())

    def give(self, slot: Slot[W]) -> None:
        """Give a taken slot back (with its worker, or empty for the next taker to fill)."""
        self._gate.release(slot)

    def attach(self, slot: Slot[W], worker: W) -> bool:
        """Put a freshly spawned worker in ``slot``; False (the caller kills it) if the pool closed meanwhile."""
        with self._lock:
            if self.closed:
                return False
            slot.worker = worker
            self.live.add(worker)
            return True

    def detach(self, slot: Slot[W]) -> W | None:
        """Empty ``slot`` and return its worker (for the caller to kill), if it had one."""
        with self._lock:
            worker, slot.worker = slot.worker, None
            if worker is not None:
                self.live.discard(worker)
            return worker

    def stale(self, slot: Slot[W]) -> bool:
        """Whether the slot holds a worker that may not take the next request (dead or outdated)."""
        return slot.worker is not None and not self._usable(slot.worker)

    def close(self) -> list[W]:
        """Mark the pool closed, fail the waiting ``take``s, and return the attached workers (to kill)."""
        with self._lock:
            self.closed = True
            workers = list(self.live)
            self.live.clear()
            for slot in self.slots:
                slot.worker = None
        self._gate.fail_waiters(self._closed_error)
        return workers


class AsyncWorkerSlots(WorkerSlots[W]):
    """Slots whose workers are started and killed by coroutines (``spawn()``, ``kill(worker)``)."""

    def __init__(self, size: int, *, spawn: Callable[[], Awaitable[W]], kill: Callable[[W], Awaitable[None]],
                 **options) -> None:
        super().__init__(size, **options)
        self._spawn = spawn
        self._kill = kill

    async def ensure(self, slot: Slot[W]) -> W:
        """The slot's worker, replaced first if it is not usable and started if there is none; a spawn error
        propagates with the slot left empty (give it back: the next taker tries again)."""
        if self.stale(slot):
            await self.replace(slot)
        if slot.worker is None:
            await self._start(slot)
        assert slot.worker is not None
        return slot.worker

    async def replace(self, slot: Slot[W]) -> None:
        """Kill the slot's worker (if any) and, with ``respawn="eager"``, start its successor now (a spawn
        error is left for the next taker, who tries again)."""
        worker = self.detach(slot)
        if worker is not None:
            await self._kill(worker)
        if self.respawn == "eager" and not self.closed:
            try:
                await self._start(slot)
            except Exception:  # the slot waits, empty, for the next taker to try again
                pass

    async def _start(self, slot: Slot[W]) -> None:
        worker = await self._spawn()
        if not self.attach(slot, worker):
            await self._kill(worker)
            self.check_open()

    async def fill(self) -> None:
        """Start a worker in every slot now (taking all slots, so it waits for runs in flight)."""
        taken = [await self.take() for _ in range(self.size)]
        try:
            await asyncio.gather(*(self.ensure(slot) for slot in taken))
        finally:
            for slot in taken:
                self.give(slot)


class ThreadWorkerSlots(WorkerSlots[W]):
    """Slots whose workers are started and killed by blocking calls, from the pool's threads."""

    def __init__(self, size: int, *, spawn: Callable[[], W], kill: Callable[[W], None], **options) -> None:
        super().__init__(size, **options)
        self._spawn = spawn
        self._kill = kill

    def ensure(self, slot: Slot[W]) -> W:
        """As :meth:`AsyncWorkerSlots.ensure`, blocking."""
        if self.stale(slot):
            self.replace(slot)
        if slot.worker is None:
            self._start(slot)
        assert slot.worker is not None
        return slot.worker

    def replace(self, slot: Slot[W]) -> None:
        """As :meth:`AsyncWorkerSlots.replace`, blocking."""
        worker = self.detach(slot)
        if worker is not None:
            self._kill(worker)
        if self.respawn == "eager" and not self.closed:
            try:
                self._start(slot)
            except Exception:  # the slot waits, empty, for the next taker to try again
                pass

    def _start(self, slot: Slot[W]) -> None:
        worker = self._spawn()
        if not self.attach(slot, worker):
            self._kill(worker)
            self.check_open()

    def fill(self) -> None:
        """Start a worker in every slot now (taking all slots, so it waits for checks in flight)."""
        taken = [self.take_sync() for _ in range(self.size)]
        try:
            for slot in taken:
                if slot.worker is None:
                    self._start(slot)
        finally:
            for slot in taken:
                self.give(slot)
