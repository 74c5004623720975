"""A sandbox built from a pool of pre-started fork-server workers (shared by the process and docker backends).

:class:`PooledSandbox` holds ``max_concurrency`` slots. A run takes a slot (waiting in FIFO order when all
are busy: that is the backpressure), makes sure the slot's worker is alive (starting or replacing it), and
sends it one request. A worker that dies, hangs past its deadline or answers garbage is discarded and the
run is answered with ``killed_reason="sandbox_error"``; the slot gets a fresh worker on its next use. A
worker that answers but says it could not clean up after the run (``retire``: files it could not wipe,
processes that survived SIGKILL) is discarded the same way, after its result is returned.
Sessions get a dedicated worker each and take a slot only while a call runs, so the cap counts them too.
Backends implement :meth:`PooledSandbox._spawn` and return a :class:`Worker`.

Nothing here is tied to one event loop: slots are handed out through a thread-safe :class:`SlotGate`, and
workers register their pipes with whichever loop is running the request. One sandbox can serve the sync
API (a background loop), async callers and several threads at once.

The pieces live by job: the slots, their queue, replacement and the spawn-failure rule are the worker-pool
core shared with the math verifier pool (:mod:`forge_env.sandbox.slots`: ``AsyncWorkerSlots``, ``SlotGate``);
:mod:`~forge_env.sandbox.workers` has the ``Worker`` protocol, reply decoding and preludes; this module keeps
``PooledSandbox`` and its ``PooledSession`` (which drives the sandbox's slots and workers) and re-exports the
rest under their old names.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from forge_env.sandbox.base import (
    ExecResult,
    SandboxBusyError,
    SandboxClosedError,
    SandboxLimits,
    as_bytes,
    check_files,
)
from forge_env.sandbox.slots import AsyncWorkerSlots, Slot, SlotGate
from forge_env.sandbox.workers import (
    DEFAULT_PRELOAD,
    PRELUDES_KEPT,
    REPLY_GRACE_S,
    Worker,
    WorkerFailure,
    error_result,
    kill_pids,
    prelude_digest,
    result_from_reply,
)

__all__ = [
    "DEFAULT_PRELOAD",
    "PRELUDES_KEPT",
    "REPLY_GRACE_S",
    "PooledSandbox",
    "PooledSession",
    "SandboxStats",
    "SlotGate",
    "Worker",
    "WorkerFailure",
    "prelude_digest",
    "result_from_reply",
]

logger = logging.getLogger(__name__)


@dataclass
class SandboxStats:
    """Counters of a pooled sandbox (for monitoring and tests)."""

    runs: int = 0
    running: int = 0
    peak_running: int = 0
    waiting: int = 0
    peak_waiting: int = 0
    workers_started: int = 0
    workers_replaced: int = 0
    sandbox_errors: int = 0


_CLOSED = "this sandbox was closed; create a new one with make_sandbox()"


class PooledSandbox:
    """Base of the pooled backends: slots, queueing, worker replacement, sessions, shutdown."""

    isolation: str = "unknown"

    def __init__(self, limits: SandboxLimits | None = None, *, max_concurrency: int | None = None,
                 max_sessions: int = 64, preload: tuple[str, ...] | None = None) -> None:
        if max_concurrency is not None and (not isinstance(max_concurrency, int) or max_concurrency < 1):
            raise ValueError(f"max_concurrency must be a positive int, got {max_concurrency!r}")
        if not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be a positive int, got {max_sessions!r}")
        self.limits = limits or SandboxLimits()
        self.max_concurrency = max_concurrency or os.cpu_count() or 1
        self.max_sessions = max_sessions
        self.preload = DEFAULT_PRELOAD if preload is None else tuple(preload)
        self.stats = SandboxStats()
        me = weakref.ref(self)  # the slots must not keep the sandbox alive: dropping it stops its workers at once
        self._pool: AsyncWorkerSlots[Worker] = AsyncWorkerSlots(
            self.max_concurrency, spawn=lambda: me()._start_worker("pool"), kill=lambda w: me()._replace_worker(w),
            usable=lambda worker: worker.alive and not me()._outdated(worker),
            closed_error=lambda: SandboxClosedError(_CLOSED))
        self._slots_list = self._pool.slots
        self._sessions: set[PooledSession] = set()
        self._sessions_lock = threading.Lock()
        self._live_pids: set[int] = set()
        self._live_paths: set[str] = set()
        self._finalizer = weakref.finalize(self, kill_pids, self._live_pids, self._live_paths)
        self._preludes_sent: weakref.WeakKeyDictionary[Worker, list[str]] = weakref.WeakKeyDictionary()

    # -- backend hook -------------------------------------------------------------------------------

    async def _spawn(self, kind: str) -> Worker:
        """Start one worker; ``kind`` is "pool" (one fresh process per run) or "session" (a REPL)."""
        raise NotImplementedError

    def _outdated(self, worker: Worker) -> bool:
        """Whether a live worker must still be replaced before its next run (backend hook)."""
        return False

    async def _start_worker(self, kind: str) -> Worker:
        worker = await self._spawn(kind)
        self.stats.workers_started += 1
        self._live_pids.update(worker.pids)
        self._live_paths.update(getattr(worker, "host_paths", ()))
        return worker

    async def _discard(self, worker: Worker) -> None:
        self._live_pids.difference_update(worker.pids)
        await worker.close()
        self._live_paths.difference_update(getattr(worker, "host_paths", ()))

    async def _replace_worker(self, worker: Worker) -> None:
        """How the pool core kills a pool worker it replaces (dead or outdated before a run)."""
        await self._discard(worker)
        self.stats.workers_replaced += 1

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def _closed(self) -> bool:
        return self._pool.closed

    def _check_open(self) -> None:
        self._pool.check_open()

    async def start(self) -> None:
        """Start every pool worker now instead of on first use (so the first runs are not slowed down)."""
        await self._pool.fill()

    async def close(self) -> None:
        """Stop every worker and session; nothing the sandbox started is left running."""
        workers = self._pool.close()  # runs waiting for a slot raise SandboxClosedError now
        for session in list(self._sessions):
            await session.close()
        for worker in workers:
            await self._discard(worker)
        kill_pids(self._live_pids, self._live_paths)

    async def __aenter__(self) -> PooledSandbox:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # -- running ------------------------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return float(self.limits.wall_timeout_s)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return float(timeout)

    def _message(self, op: str, code: str, stdin: str | bytes | None,
                 files: Mapping[str, str | bytes] | None, timeout: float, prelude: str | None = None) -> dict[str, Any]:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if prelude is not None and not isinstance(prelude, str):
            raise TypeError(f"prelude must be a str, got {type(prelude).__name__}")
        data = as_bytes(stdin)
        return {
            "prelude": prelude,
            "op": op,
            "code": code,
            "stdin": None if data is None else base64.b64encode(data).decode("ascii"),
            "files": {name: base64.b64encode(content).decode("ascii") for name, content in check_files(files).items()},
            "limits": self.limits.to_wire(),
            "timeout": timeout,
        }

    async def _take_slot(self) -> Slot[Worker]:
        self._check_open()
        self.stats.waiting += 1
        self.stats.peak_waiting = max(self.stats.peak_waiting, self.stats.waiting)
        try:
            slot = await self._pool.take()
        finally:
            self.stats.waiting -= 1
        self.stats.running += 1
        self.stats.peak_running = max(self.stats.peak_running, self.stats.running)
        return slot

    def _give_slot(self, slot: Slot[Worker]) -> None:
        self.stats.running -= 1
        self._pool.give(slot)

    async def run(self, code: str, *, stdin: str | bytes | None = None,
                  files: Mapping[str, str | bytes] | None = None, timeout: float | None = None,
                  prelude: str | None = None) -> ExecResult:
        """Run ``code`` as ``__main__`` in a fresh process and working directory; never raises for bad code.

        ``prelude`` is optional *trusted* setup code (say, a test harness): each worker runs it once, outside
        the per-run process, and every run starts with its globals, so only ``code`` is paid per run.
        Never pass untrusted code as a prelude.
        """
        seconds = self._timeout(timeout)
        message = self._message("run", code, stdin, files, seconds, prelude)
        slot = await self._take_slot()
        try:
            worker = await self._pool.ensure(slot)  # a dead or outdated worker is replaced, a missing one started
            self.stats.runs += 1
            message = self._prelude_once(worker, message)
            return await self._ask(worker, message, seconds, on_failure=lambda: self._pool.detach(slot))
        finally:
            self._give_slot(slot)

    def _prelude_once(self, worker: Worker, message: dict[str, Any]) -> dict[str, Any]:
        """``message`` naming its prelude by digest, with the text only the first time this worker gets it
        (the worker keeps the last PRELUDES_KEPT texts it was sent, dropping the oldest as this does)."""
        text = message.get("prelude")
        if text is None:
            return message
        key = prelude_digest(text)
        sent = self._preludes_sent.setdefault(worker, [])
        if key in sent:
            return {**message, "prelude": None, "prelude_key": key}
        sent.append(key)
        if len(sent) > PRELUDES_KEPT:
            sent.pop(0)
        return {**message, "prelude_key": key}

    async def _ask(self, worker: Worker, message: dict[str, Any], seconds: float, on_failure) -> ExecResult:
        try:
            reply = await worker.request(message, seconds + REPLY_GRACE_S)
        except asyncio.CancelledError:
            # The reply may still come and would be read as the answer to the next request: retire the worker.
            on_failure()
            asyncio.ensure_future(self._discard(worker))
            self.stats.workers_replaced += 1
            raise
        except WorkerFailure as exc:
            on_failure()
            await self._discard(worker)
            self.stats.workers_replaced += 1
            self.stats.sandbox_errors += 1
            logger.warning("sandbox worker failed and is replaced: %s", exc)
            return error_result(f"sandbox error: {exc} (the worker was replaced)")
        if "error" in reply or "retire" in reply:
            # The worker could not set up or clean up after a run: what it holds (files, processes, kernel
            # objects) may leak into the next run, so it is never reused.
            on_failure()
            await self._discard(worker)
            self.stats.workers_replaced += 1
            logger.warning("sandbox worker retired: %s", reply.get("retire") or reply.get("error"))
        if "error" in reply:
            self.stats.sandbox_errors += 1
            return error_result(f"sandbox error: {reply['error']}")
        return result_from_reply(reply)

    @property
    def worker_pids(self) -> list[int]:
        """Host pids of the running pool workers (for monitoring: CPU accounting, debugging)."""
        return [pid for slot in self._slots_list if slot.worker is not None for pid in slot.worker.pids]

    def __deepcopy__(self, memo: dict) -> PooledSandbox:
        return self  # a pool of processes is a shared resource: copies of an environment share it

    def __copy__(self) -> PooledSandbox:
        return self

    def session(self) -> PooledSession:
        """A persistent interpreter (``async with sandbox.session() as s: await s.run("x = 1")``)."""
        return PooledSession(self)


class PooledSession:
    """A REPL that keeps its state between calls, on a worker of its own (see ``PooledSandbox.session``)."""

    def __init__(self, sandbox: PooledSandbox) -> None:
        self._sandbox = sandbox
        self._worker: Worker | None = None
        self._turn = SlotGate([None])  # one call at a time, from any loop or thread
        self._closed = False
        self._lost_state = False

    async def __aenter__(self) -> PooledSession:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the session's interpreter (``run`` does it on first use)."""
        sandbox = self._sandbox
        sandbox._check_open()
        if self._closed:
            raise SandboxClosedError("this session was closed; open a new one with sandbox.session()")
        with sandbox._sessions_lock:
            if self not in sandbox._sessions:
                if len(sandbox._sessions) >= sandbox.max_sessions:
                    raise SandboxBusyError(f"{sandbox.max_sessions} sessions are already open; close one first "
                                           f"or create the sandbox with a larger max_sessions")
                sandbox._sessions.add(self)
        if self._worker is None or not self._worker.alive:
            if self._worker is not None:
                await sandbox._discard(self._worker)
                self._lost_state = True
            self._worker = await sandbox._start_worker("session")

    async def run(self, code: str, *, stdin: str | bytes | None = None,
                  files: Mapping[str, str | bytes] | None = None, timeout: float | None = None) -> ExecResult:
        """Run one cell; its variables, imports and files stay for the next call. A final expression's value
        is printed as in the interactive interpreter."""
        sandbox = self._sandbox
        seconds = sandbox._timeout(timeout)
        message = sandbox._message("exec", code, stdin, files, seconds)
        turn = await self._turn.acquire()
        try:
            await self.start()
            slot = await sandbox._take_slot()
            try:
                sandbox.stats.runs += 1
                assert self._worker is not None
                result = await sandbox._ask(self._worker, message, seconds, on_failure=self._forget_worker)
            finally:
                sandbox._give_slot(slot)
        finally:
            self._turn.release(turn)
        if self._lost_state and result.killed_reason != "sandbox_error":
            self._lost_state = False
            result.stderr += "[sandbox] the session's worker was replaced: earlier state is gone\n"
        return result

    def _forget_worker(self) -> None:
        self._worker = None
        self._lost_state = True

    async def close(self) -> None:
        """Stop the session's interpreter and everything it started."""
        self._closed = True
        with self._sandbox._sessions_lock:
            self._sandbox._sessions.discard(self)
        if self._worker is not None:
            worker, self._worker = self._worker, None
            await self._sandbox._discard(worker)
