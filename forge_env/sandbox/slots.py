"""``SlotGate``: a FIFO semaphore handing out objects, from any thread and any event loop.

The pooled sandbox hands out its worker slots through one (the backpressure of ``max_concurrency``), and a
session serialises its calls through another.
"""

from __future__ import annotations

import asyncio
import collections
import threading


class SlotGate:
    """A FIFO semaphore handing out objects, usable from any thread and any event loop.

    ``acquire`` waits on a future of the caller's own loop; ``release`` wakes the longest waiter through
    its loop (``call_soon_threadsafe``), or puts the object back when nobody waits.
    """

    def __init__(self, items: list) -> None:
        self._free = collections.deque(items)
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = collections.deque()
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

    def release(self, item) -> None:
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                if not loop.is_closed():
                    loop.call_soon_threadsafe(self._deliver, future, item)
                    return
            self._free.append(item)

    def _deliver(self, future: asyncio.Future, item) -> None:
        if future.done():  # cancelled in the meantime
            self.release(item)
        else:
            future.set_result(item)
