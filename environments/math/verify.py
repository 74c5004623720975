"""A pool of worker processes that verify math answers under a hard deadline.

Sympy can hang on hostile input (``\\boxed{2^{2^{40}}}``) or exhaust memory, and
math-verify's own timeouts use ``signal.alarm``, which works only on a main thread.
So checks run in separate processes (``environments.math.verify_worker``): a check that
passes its deadline gets its worker killed (SIGKILL) and replaced, a crashed worker is
replaced too, and the caller receives a ``Verdict`` with status ``timeout`` or
``worker_crashed``. The event loop never blocks: ``await pool.verify(...)`` waits in a
thread of the pool's own executor, one thread per worker. No signals are used anywhere.

The pool is not tied to an event loop, so one pool can serve many environments across
loops and threads; ``shared_pool()`` is the process-wide default the environments use.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.math.grading import DEFAULT_MAX_ANSWER_CHARS, AnswerVerdict
from forge_env.errors import InfraError
from forge_env.sandbox.slots import Slot, ThreadWorkerSlots

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


class VerifierClosedError(RuntimeError):
    """The pool was closed; create a new VerifierPool (or use shared_pool())."""


class VerifierUnavailableError(InfraError):
    """No worker could be started to take a check (the machine could not spawn a process): the machine's
    failure, not the reply's, so the episode is dropped as ``infra_error`` rather than graded 0."""


class _WorkerTimeout(Exception):
    pass


class _WorkerDied(Exception):
    pass


class _WorkerGone(_WorkerDied):
    """The worker died before it took the check (while idle, or starting): the check never ran."""


#: A check goes to at most this many workers in a row that die before taking it, then is ``worker_crashed``.
_HANDOFF_TRIES = 3


@dataclass
class VerifierConfig:
    """Settings of a VerifierPool.

    ``deadline_s`` bounds one check (its worker is killed past it); ``max_input_chars`` caps
    the reply and reference sent to a worker; ``max_answer_chars`` caps the extracted answer
    handed to sympy. ``target`` is the ``module:function`` a worker calls with each payload.
    """

    num_workers: int = 2
    deadline_s: float = 5.0
    max_input_chars: int = 50_000
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS
    startup_timeout_s: float = 60.0
    memory_limit_mb: int = 2048
    target: str = "environments.math.grading:grade_payload"
    preload: tuple[str, ...] = field(default=("math_verify", "sympy"))

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")
        if self.max_input_chars < 1 or self.max_answer_chars < 1:
            raise ValueError("max_input_chars and max_answer_chars must be >= 1")


class _Worker:
    """One worker process and the line-oriented pipe protocol to it (used by one thread at a time)."""

    def __init__(self, config: VerifierConfig) -> None:
        argv = [sys.executable, "-m", "environments.math.verify_worker", config.target]
        for module in config.preload:
            argv += ["--preload", module]
        argv += ["--memory-limit-mb", str(config.memory_limit_mb)]
        env = dict(os.environ)
        # The worker imports the same code as this process, wherever it was imported from.
        paths = [_PROJECT_ROOT, *(p for p in sys.path if p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's business
        )
        self._buffer = b""
        self.ready = False
        self.taken = 0  # checks this worker said it took (for tests and monitoring)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_line(self, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _WorkerTimeout
            if not poller.poll(remaining * 1000):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _WorkerDied(f"worker exited with code {self.proc.wait()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def call(self, payload: dict[str, Any], deadline_s: float, startup_timeout_s: float) -> dict[str, Any]:
        if not self.ready:
            try:
                hello = self._read_line(time.monotonic() + startup_timeout_s)
            except _WorkerTimeout:  # not retried: another worker would likely take as long
                raise _WorkerDied(f"worker did not start within {startup_timeout_s} s") from None
            except _WorkerDied as exc:
                raise _WorkerGone(f"worker died while starting: {exc}") from None
            if json.loads(hello) != {"ready": True}:
                raise _WorkerGone(f"worker sent {hello[:200]!r} instead of its ready line")
            self.ready = True
        assert self.proc.stdin is not None
        deadline = time.monotonic() + deadline_s
        try:
            self.proc.stdin.write(json.dumps({"payload": payload}).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _WorkerGone(f"worker exited with code {self.proc.wait()} before it took the check") from None
        try:  # the worker says it has the check before it runs it: dying before that is not the check's doing
            took = self._read_line(deadline)
        except _WorkerDied as exc:
            raise _WorkerGone(f"{exc} before it took the check") from None
        if json.loads(took) != {"took": True}:
            raise _WorkerDied(f"worker sent {took[:200]!r} instead of taking the check")
        self.taken += 1
        return json.loads(self._read_line(deadline))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def _shutdown(workers: set[_Worker], executor: ThreadPoolExecutor) -> None:
    for worker in list(workers):
        worker.kill()
    workers.clear()
    executor.shutdown(wait=False)  # queued checks still run: they find the pool closed and say so


class VerifierPool:
    """Verifies answers in worker processes with a per-check deadline.

    >>> pool = VerifierPool(num_workers=2, deadline_s=5)
    >>> verdict = await pool.verify("... so the answer is \\\\boxed{\\\\frac{1}{2}}", "0.5")
    >>> verdict.correct, verdict.status
    (True, 'correct')

    Workers start lazily on the first check (or on ``start()``) and live until ``close()``,
    interpreter exit, or garbage collection of the pool. The slots, their queue, replacement and the
    spawn-failure rule are :mod:`forge_env.sandbox.slots`'s (shared with the sandbox pool); a replaced
    worker's successor is started at once (``respawn="eager"``: it imports sympy while idle).
    """

    def __init__(self, config: VerifierConfig | None = None, **overrides: Any) -> None:
        if config is not None and overrides:
            raise TypeError("pass either a VerifierConfig or keyword overrides, not both")
        self.config = config or VerifierConfig(**overrides)
        me = weakref.ref(self)  # the slots must not keep the pool alive: dropping it stops its workers at once
        self._slots: ThreadWorkerSlots[_Worker] = ThreadWorkerSlots(
            self.config.num_workers, spawn=lambda: me()._spawn(), kill=lambda w: me()._kill(w),
            usable=lambda w: w.proc.poll() is None,
            closed_error=lambda: VerifierClosedError("this VerifierPool is closed"), respawn="eager")
        self._workers = self._slots.live  # the live workers (for monitoring and tests)
        self._lock = threading.RLock()  # stats and start (start's spawns count their failures under it)
        self._started = False
        self._executor = ThreadPoolExecutor(self.config.num_workers, thread_name_prefix="math-verifier")
        self.stats = {"checks": 0, "timeouts": 0, "crashes": 0, "restarts": 0, "handoff_retries": 0,
                      "spawn_failures": 0}
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._executor)

    def start(self) -> VerifierPool:
        """Spawn the worker processes now (they import math-verify in the background)."""
        with self._lock:
            self._slots.check_open()
            if not self._started:
                self._started = True  # a slot left empty by a failed spawn is filled by its next taker
                self._slots.fill()
        return self

    def _spawn(self) -> _Worker:
        """A new worker; raises ``OSError`` (counted in ``spawn_failures``) if none can be started."""
        try:
            return _Worker(self.config)
        except OSError:  # no process now (EAGAIN, ENOMEM, EMFILE): the slot waits for the next taker to retry
            with self._lock:
                self.stats["spawn_failures"] += 1
            raise

    def _kill(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self.stats["restarts"] += 1

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for monitoring and tests)."""
        return [w.pid for w in list(self._workers)]

    def _take(self) -> tuple[Slot[_Worker], _Worker]:
        """A slot and its worker, live as far as ``poll`` can tell (one killed but still exiting is caught on
        hand-off); ``VerifierUnavailableError`` if the slot is empty and no worker can be started."""
        slot = self._slots.take_sync()
        try:
            return slot, self._slots.ensure(slot)
        except OSError as exc:
            self._slots.give(slot)  # the slot stays, empty, for the next check to try
            raise VerifierUnavailableError(f"no verifier worker could be started: {exc}") from exc
        except BaseException:
            self._slots.give(slot)
            raise

    def _too_long(self, prediction: str, reference: str) -> AnswerVerdict | None:
        cap = self.config.max_input_chars
        for name, text in (("reply", prediction), ("reference", reference)):
            if len(text) > cap:
                return AnswerVerdict(
                    False,
                    "too_long",
                    detail=f"{name} is {len(text)} chars, over the cap of {cap} (max_input_chars); not checked",
                )
        return None

    def verify_sync(self, prediction: str, reference: str) -> AnswerVerdict:
        """Blocking form of ``verify`` for threads and scripts (never call it on an event loop)."""
        if not isinstance(prediction, str) or not isinstance(reference, str):
            raise TypeError(
                f"prediction and reference must be str, got {type(prediction).__name__} "
                f"and {type(reference).__name__}"
            )
        capped = self._too_long(prediction, reference)
        if capped is not None:
            return capped
        self.start()
        payload = {"prediction": prediction, "reference": reference, "max_answer_chars": self.config.max_answer_chars}
        for tries in range(1, _HANDOFF_TRIES + 1):
            slot, worker = self._take()
            if tries == 1:
                with self._lock:
                    self.stats["checks"] += 1
            try:
                reply = worker.call(payload, self.config.deadline_s, self.config.startup_timeout_s)
            except _WorkerTimeout:
                with self._lock:
                    self.stats["timeouts"] += 1
                self._replace(slot)
                return AnswerVerdict(
                    False,
                    "timeout",
                    detail=f"check exceeded its deadline of {self.config.deadline_s} s; its worker was killed",
                )
            except _WorkerGone as exc:  # it died before it took the check: the check goes to a fresh worker
                with self._lock:
                    self.stats["handoff_retries"] += 1
                self._replace(slot)
                if tries == _HANDOFF_TRIES:
                    return AnswerVerdict(False, "worker_crashed", detail=f"{tries} workers in a row died before "
                                                                   f"taking the check; the last: {exc}")
                continue
            except (_WorkerDied, ValueError) as exc:  # ValueError: a garbled reply line
                with self._lock:
                    self.stats["crashes"] += 1
                self._replace(slot)
                return AnswerVerdict(False, "worker_crashed", detail=str(exc))
            except BaseException:
                self._replace(slot)
                raise
            break
        self._slots.give(slot)
        if "error" in reply:
            return AnswerVerdict(False, "error", detail=reply["error"])
        return AnswerVerdict.from_dict(reply["ok"])

    def _replace(self, slot: Slot[_Worker]) -> None:
        """Kill the slot's worker, start its successor, and give the slot back."""
        try:
            self._slots.replace(slot)
        finally:
            self._slots.give(slot)

    async def verify(self, prediction: str, reference: str) -> AnswerVerdict:
        """Grade ``prediction`` against ``reference`` in a worker; never blocks the event loop."""
        self._slots.check_open()
        future = self._executor.submit(self.verify_sync, prediction, reference)
        return await asyncio.wrap_future(future)

    async def verify_many(self, pairs: Iterable[tuple[str, str]]) -> list[AnswerVerdict]:
        """Verify many (prediction, reference) pairs concurrently, results in input order."""
        return list(await asyncio.gather(*(self.verify(p, r) for p, r in pairs)))

    def close(self) -> None:
        """Kill the workers; later calls raise VerifierClosedError (so do checks waiting for a worker)."""
        for worker in self._slots.close():
            worker.kill()
        self._finalizer()

    def __deepcopy__(self, memo: dict) -> VerifierPool:
        return self  # a pool is a shared service: copies of an environment keep using it

    @property
    def closed(self) -> bool:
        return self._slots.closed

    def __enter__(self) -> VerifierPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: VerifierPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> VerifierPool:
    """The process-wide default pool (created on first use with default settings, closed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.closed:
            _shared = VerifierPool()
            atexit.register(_shared.close)
        return _shared
