"""Replicas as plain objects in this process: the debugging and unit-test backend.

Same behaviour as Monarch where it matters to callers: an actor runs one ordinary
endpoint at a time (``@concurrent_endpoint`` ones overlap), sync endpoints run off the
event loop, an endpoint's exception reaches the caller as itself, and an endpoint
that raises ``SystemExit`` kills its replica (as it kills a Monarch actor), which is
how unit tests exercise failure and respawn without real processes.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Callable
from typing import Any

from forge_env.services.endpoints import endpoint_method
from forge_env.services.replica import ReplicaDown


class LocalReplica:
    """One in-process actor instance behind the replica handle interface."""

    def __init__(self, name: str, instance: Any) -> None:
        self.name = name
        self.instance = instance
        self.pids = [os.getpid()]
        self._serial = asyncio.Lock()
        self._on_death: Callable[[str], None] | None = None
        self._dead = False
        self._stopped = False

    async def call(self, endpoint: str, args: tuple, kwargs: dict) -> Any:
        if self._dead or self._stopped:
            raise ReplicaDown(f"{self.name} is not running")
        method, concurrent = endpoint_method(type(self.instance), endpoint)
        try:
            if concurrent:
                return await method(self.instance, *args, **kwargs)
            async with self._serial:
                if inspect.iscoroutinefunction(method):
                    return await method(self.instance, *args, **kwargs)
                return await asyncio.to_thread(method, self.instance, *args, **kwargs)
        except SystemExit as exit_:
            self._die(f"actor raised SystemExit({exit_.code})")
            raise ReplicaDown(f"{self.name}: actor raised SystemExit({exit_.code})") from None

    def _die(self, reason: str) -> None:
        if self._dead:
            return
        self._dead = True
        if self._on_death is not None and not self._stopped:
            asyncio.get_running_loop().call_soon(self._on_death, reason)

    def watch(self, on_death: Callable[[str], None]) -> None:
        self._on_death = on_death

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        cleanup = getattr(self.instance, "__cleanup__", None)
        if cleanup is not None and not getattr(cleanup, "_monarch_doc_stub", False):
            result = cleanup(None)
            if inspect.isawaitable(result):
                await result


async def spawn_local_replica(actor_class: type, args: tuple, kwargs: dict, name: str) -> LocalReplica:
    """Build the actor in this process (its ``__init__`` runs here, synchronously)."""
    return LocalReplica(name, actor_class(*args, **kwargs))
