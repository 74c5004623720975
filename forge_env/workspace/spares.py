"""Spare sessions: workspace sessions started ahead of need, so an episode's set-up is only the unpack.

Starting a session's worker (bubblewrap and an interpreter, or a container) is most of a workspace's
set-up. :class:`Spares` keeps ``size`` sessions per sandbox started on forge-env's background event loop
(sessions are not tied to a loop), each a fresh worker that has run nothing but the helper definitions
(:data:`~forge_env.workspace.cell.CELL`). Taking one starts its replacement. A spare started before a file was hidden
from sandboxes (``hide_from_sandboxes``) is discarded, never handed out; so is one that failed to start
(the workspace then starts its own session, whose failure is the episode's ``InfraError``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import weakref

from forge_env.sandbox import Sandbox, SandboxSession, hidden
from forge_env.utils.aio import background_loop
from forge_env.workspace.cell import CELL

logger = logging.getLogger(__name__)
READY = '\n_reply({"ok": "ready"})\n'


class Spares:
    """Up to ``size`` started sessions of one sandbox (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, size: int) -> None:
        self.sandbox = sandbox
        self.size = size
        self._ready: list[tuple[int, concurrent.futures.Future]] = []
        self._lock = threading.Lock()

    def take(self) -> concurrent.futures.Future | None:
        """A future of a started session (None: none is spare), and start a replacement."""
        with self._lock:
            found = None
            while self._ready and found is None:
                generation, future = self._ready.pop(0)
                if generation == hidden.generation():
                    found = future
                else:
                    future.add_done_callback(_close_quietly)
        self.refill()
        return found

    def refill(self) -> None:
        with self._lock:
            while len(self._ready) < self.size and not getattr(self.sandbox, "_closed", False):
                coroutine = self._start()
                self._ready.append((hidden.generation(), asyncio.run_coroutine_threadsafe(coroutine, background_loop())))

    async def _start(self) -> SandboxSession:
        session = self.sandbox.session()
        result = await session.run(CELL + READY, timeout=120)
        if '"ready"' not in result.stdout:
            await session.close()
            raise RuntimeError(f"a spare workspace session did not start: {result.summary(300)}")
        return session

    def close(self) -> None:
        """Close every spare (from any thread; the closing runs on the background loop)."""
        with self._lock:
            ready, self._ready = self._ready, []
        for _, future in ready:
            future.add_done_callback(_close_quietly)


def _close_quietly(future: concurrent.futures.Future) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    asyncio.run_coroutine_threadsafe(future.result().close(), background_loop())


_spares: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_spares_lock = threading.Lock()


def spares_for(sandbox: Sandbox, size: int) -> Spares:
    """The sandbox's :class:`Spares` (created on first use, grown to ``size``)."""
    with _spares_lock:
        found = _spares.get(sandbox)
        if found is None:
            found = _spares[sandbox] = Spares(sandbox, size)
        found.size = max(found.size, size)
        return found


async def take_session(sandbox: Sandbox, size: int) -> SandboxSession | None:
    """A started spare session of ``sandbox``, or None (the caller starts its own)."""
    if size <= 0:
        return None
    future = spares_for(sandbox, size).take()
    if future is None:
        return None
    try:
        return await asyncio.wrap_future(future)
    except Exception as exc:  # the machine's trouble shows again when the caller starts its own session
        logger.warning("a spare workspace session failed to start (%s); starting one for this episode", exc)
        return None


def close_spares(sandbox: Sandbox) -> None:
    """Close the spares of ``sandbox`` (e.g. before closing it)."""
    with _spares_lock:
        found = _spares.pop(sandbox, None)
    if found is not None:
        found.close()
