"""Polling helper for tests that wait on background work (respawns, reapers)."""

import asyncio
import inspect


async def wait_until(predicate, timeout: float = 30.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` (sync or async) until it is true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert loop.time() < deadline, f"condition not reached within {timeout} s"
        await asyncio.sleep(interval)
