"""``PooledSession``: a persistent interpreter on a worker of its own, opened by ``PooledSandbox.session()``.

The session takes one of the sandbox's slots only while a call runs (so ``max_concurrency`` counts it),
counts against ``max_sessions`` while open, and replaces a dead worker on the next call, telling the caller
that the earlier state is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from forge_env.sandbox.base import ExecResult, SandboxBusyError, SandboxClosedError
from forge_env.sandbox.slots import SlotGate
from forge_env.sandbox.workers import Worker

if TYPE_CHECKING:
    from forge_env.sandbox.pool import PooledSandbox


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
