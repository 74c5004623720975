"""ForgeActor: a Monarch actor that knows how to deploy itself, as in TorchForge.

    class Counter(ForgeActor):
        @endpoint
        async def setup(self): ...            # heavy initialisation, run after spawning
        @endpoint
        async def incr(self, by: int = 1) -> int: ...

    actor = await Counter.options(procs=1).as_actor()            # one actor mesh (Monarch's call_one/call)
    svc = await Counter.options(num_replicas=4).as_service()     # replicas: route / fanout / session
    await Counter.shutdown(svc)

``options()`` returns a configured subclass; the class that is actually spawned is
always the original one (so it is importable in the replica processes).
"""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any, ClassVar, Self

from monarch._src.actor.endpoint import EndpointProperty
from monarch.actor import Actor, ActorError, concurrent_endpoint, endpoint

from forge_env.services import direct_channel
from forge_env.services.endpoints import endpoint_method, endpoint_names
from forge_env.services.errors import ReplicaSpawnError
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import PlacementError, ReplicaPlacement, machine_id, resolve_hosts
from forge_env.services.service import Service
from forge_env.services.spawning import mesh_name, spawn_handle

_actor_handles: dict[int, Any] = {}  # id(actor mesh) -> its replica handle, for ForgeActor.shutdown


def _where() -> dict[str, Any]:
    return {"pid": os.getpid(), "machine": machine_id()}


def _where_endpoint(is_async: bool) -> EndpointProperty:
    # Monarch refuses actors mixing sync and async endpoints, so this internal endpoint
    # takes the kind of the subclass's own endpoints. Async ones answer concurrently, so a
    # heartbeat is not queued behind a long call.
    if is_async:
        async def _forge_where(self: Any) -> dict[str, Any]:
            return _where()
        return concurrent_endpoint(_forge_where)

    def _forge_where(self: Any) -> dict[str, Any]:  # type: ignore[misc]
        return _where()
    return endpoint(_forge_where)


async def _forge_batch(self: Any, name: str, calls: list[tuple[tuple, dict]]) -> list[tuple[bool, Any]]:
    """Several calls of the concurrent endpoint ``name`` that arrived in one message, run concurrently:
    ``(True, result)`` or ``(False, exception)`` each, in order (see ``MonarchReplica``'s batching)."""
    method, concurrent = endpoint_method(type(self), name)
    if not concurrent:
        raise ValueError(f"{type(self).__qualname__}.{name} is not a concurrent endpoint; it cannot be batched")

    async def one(args: tuple, kwargs: dict) -> tuple[bool, Any]:
        try:
            return True, await method(self, *args, **kwargs)
        except Exception as error:  # one call's error is its own, as if it had been sent alone
            return False, direct_channel.sendable_error(error)

    return list(await asyncio.gather(*(one(args, kwargs) for args, kwargs in calls)))


async def _forge_channel(self: Any) -> tuple[str, bytes]:
    """Open (once) this actor's socket for direct calls of its concurrent endpoints: (address, token)."""
    return await direct_channel.serve(self, endpoint_method)


class ForgeActor(Actor):
    """Base class of actors deployed with ``as_actor`` / ``as_service``; configure with ``options()``."""

    _forge_options: ClassVar[ServiceOptions] = ServiceOptions()
    _forge_origin: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_forge_origin" in cls.__dict__:
            return  # a configured copy made by options(); it inherits everything
        kinds = {inspect.iscoroutinefunction(getattr(cls, name)._method) for name in endpoint_names(cls)}
        cls._forge_where = _where_endpoint(is_async=kinds != {False})
        if kinds == {True}:  # async endpoints only: concurrent calls can travel together (one message each way)
            cls._forge_batch = concurrent_endpoint(_forge_batch)
            cls._forge_channel = concurrent_endpoint(_forge_channel)  # ... or beside Monarch (direct_calls)

    @classmethod
    def options(cls, **options: Any) -> type[Self]:
        """A copy of this class with deployment options set (see :class:`ServiceOptions` for the names)."""
        origin = cls._forge_origin or cls
        configured = cls._forge_options.replace(**options)
        return type(origin.__name__, (origin,), {  # type: ignore[return-value]
            "_forge_options": configured, "_forge_origin": origin, "__module__": origin.__module__,
            "__qualname__": origin.__qualname__, "__doc__": origin.__doc__,
        })

    @classmethod
    async def as_service(cls, *args: Any, **kwargs: Any) -> Service:
        """Spawn ``num_replicas`` replicas (``procs`` processes each) and return the :class:`Service`.

        ``args``/``kwargs`` go to the actor's ``__init__``; its ``setup`` endpoint, if any, runs on each replica.
        """
        origin = cls._forge_origin or cls
        return await Service(origin, args, kwargs, cls._forge_options).start()

    @classmethod
    async def as_actor(cls, *args: Any, **kwargs: Any) -> Any:
        """Spawn one actor mesh of ``procs`` processes and run ``setup``; returns Monarch's ActorMesh.

        Call it as in Monarch: ``await actor.method.call_one(...)`` (one process) or ``.call(...)``.
        With ``backend="local"`` the returned object has the same ``call_one``/``call``.
        """
        origin = cls._forge_origin or cls
        options = cls._forge_options
        if options.num_replicas != 1:
            raise ValueError(f"{origin.__qualname__}.as_actor spawns one actor mesh; num_replicas="
                             f"{options.num_replicas} is for as_service()")
        name = mesh_name(options.mesh_name or origin.__name__, os.getpid(), "actor", len(_actor_handles))
        group = resolve_hosts(options.hosts)
        host = None
        if group is not None:
            if options.backend == "local":
                raise ValueError(f"{origin.__qualname__}: hosts={options.hosts!r} needs backend='monarch'")
            try:
                host = (group, ReplicaPlacement(group, None).choose(0))
            except PlacementError as error:
                raise ReplicaSpawnError(f"{origin.__qualname__}: {error}") from error
        handle = await spawn_handle(origin, args, kwargs, options, name, host)
        handle.watch(lambda reason: _report_actor_failure(name, reason))
        actor = handle.mesh if options.backend == "monarch" else LocalActor(handle)  # type: ignore[attr-defined]
        _actor_handles[id(actor)] = handle
        return actor

    @classmethod
    async def shutdown(cls, target: Any) -> None:
        """Stop a service or an actor made by ``as_service`` / ``as_actor``."""
        if isinstance(target, Service):
            await target.shutdown()
            return
        handle = _actor_handles.pop(id(target), None)
        if handle is None:
            raise ValueError(f"{target!r} was not made by as_actor()/as_service() (or is already shut down)")
        await handle.stop()


def _report_actor_failure(name: str, reason: str) -> None:
    import logging

    logging.getLogger(__name__).error("actor %s failed: %s (plain actors are not respawned; use as_service)",
                                      name, reason)


class LocalActor:
    """What ``as_actor`` returns on the local backend: endpoints with Monarch's ``call_one`` / ``call``."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def __getattr__(self, name: str) -> LocalEndpoint:
        if name.startswith("__"):
            raise AttributeError(name)
        endpoint_method(type(self._handle.instance), name)  # raises AttributeError naming the endpoints
        return LocalEndpoint(self._handle, name)


class LocalEndpoint:
    """``call_one`` / ``call`` on an in-process actor; errors arrive wrapped in Monarch's ``ActorError``."""

    def __init__(self, handle: Any, name: str) -> None:
        self._handle = handle
        self._name = name

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._handle.call(self._name, args, kwargs)
        except Exception as error:
            raise ActorError(error, f"Actor call {self._name} failed.") from error

    async def call(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Every rank's result, in rank order (a local actor has one rank)."""
        return [await self.call_one(*args, **kwargs)]
