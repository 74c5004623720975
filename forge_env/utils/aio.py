"""Bridging between sync callers and the async core.

The SDK is async first. Sync wrappers (``TextEnv.reset``/``step`` and friends) run
their coroutine on one background event loop owned by this module, so they work
from plain scripts and from inside a running loop (notebooks) alike, and async
resources created by one sync call stay usable by the next.

The loop belongs to the process that started it: after ``fork()`` the child has a
copy of the loop object but not its thread, so the child forgets it and starts its
own on first use (gymnasium's async vector envs fork their workers). A waiter also
never blocks on a loop whose thread has died: it raises instead of hanging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_lock = threading.Lock()
# How often a waiter checks that the loop's thread is still alive.
_LIVENESS_POLL_S = 1.0


def _forget_loop_in_child() -> None:
    """After fork: the parent's loop thread does not exist here; start afresh on next use."""
    global _loop, _thread, _lock
    _loop = None
    _thread = None
    _lock = threading.Lock()  # the parent may have held it at fork time


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop_in_child)


def background_loop() -> asyncio.AbstractEventLoop:
    """The shared background event loop (started on first use, daemon thread)."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="forge-env-sync-loop", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


class BackgroundLoopDied(RuntimeError):
    """The background loop's thread ended while a sync call waited on it."""


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` to completion on the background loop and return its result (re-raising its exception).

    ``timeout`` (seconds) bounds the wait; on expiry the coroutine is cancelled and
    ``TimeoutError`` raised. Without it the wait still ends if the loop's thread dies.
    """
    loop = background_loop()
    thread = _thread
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("run_sync called from the background loop itself; await the coroutine instead")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = _LIVENESS_POLL_S if deadline is None else max(0.0, min(_LIVENESS_POLL_S, deadline - time.monotonic()))
        try:
            return future.result(wait)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                raise TimeoutError(f"run_sync: coroutine did not finish within {timeout} s") from None
            if thread is not None and not thread.is_alive():
                future.cancel()
                raise BackgroundLoopDied(
                    "the forge-env background event loop is gone (its thread ended); the call cannot complete"
                ) from None
