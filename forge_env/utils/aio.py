"""Bridging between sync callers and the async core.

The SDK is async first. Sync wrappers (``TextEnv.reset``/``step`` and friends) run
their coroutine on one background event loop owned by this module, so they work
from plain scripts and from inside a running loop (notebooks) alike, and async
resources created by one sync call stay usable by the next.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The shared background event loop (started on first use, daemon thread)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="forge-env-sync-loop", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` to completion on the background loop and return its result (re-raising its exception)."""
    loop = background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("run_sync called from the background loop itself; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)
