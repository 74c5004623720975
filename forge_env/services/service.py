"""A service: replicas of one actor class behind route / fanout / session.

``svc.<endpoint>.route(...)`` sends a call to one healthy replica (picked by the router
that ``load_balancing`` names, see :mod:`~forge_env.services.routing`), ``svc.<endpoint>.fanout(...)``
to every replica, and calls made inside ``async with svc.session():`` (or with ``session_id=``)
all land on the replica that holds that session. Each replica runs at most
``max_concurrent_per_replica`` calls at once; the rest wait in its FIFO queue.

The ``Service`` keeps spawning (through :class:`~forge_env.services.spawning.ReplicaSpawner`),
health and sessions; the verbs (:mod:`~forge_env.services.verbs`) reach it only through its
public calling API (``route_call``, ``fanout_call``, ``open_session``, ``release_session``,
``session_replica``).

Failures: a replica whose process exits or whose actor fails is marked unhealthy at
once (its queued and in-flight calls are failed) and respawned in the background.
A stateless ``route`` call that hit it is retried on a healthy replica; a session call
raises ``SessionLostError``. An exception raised by the endpoint itself is an
application error: it reaches the caller unchanged and the replica stays healthy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Coroutine
from typing import Any

from forge_env.services.endpoints import accepts_session_id, endpoint_names, unknown_endpoint_message
from forge_env.services.errors import (
    NoHealthyReplicaError,
    ReplicaFailedError,
    ServiceClosedError,
    ServiceError,
    SessionLostError,
)
from forge_env.services.metrics import LatencyWindow, ServiceMetrics, service_metrics
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import ReplicaPlacement, resolve_hosts
from forge_env.services.replica import Replica, ReplicaHandle
from forge_env.services.routing import routers_for
from forge_env.services.sessions import SessionRecord, SessionTable, active_session
from forge_env.services.spawning import ReplicaSpawner, host_label, mesh_name
from forge_env.services.verbs import ServiceEndpoint, ServiceSession

logger = logging.getLogger(__name__)

_service_ids = itertools.count()
_RESPAWN_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class Service:
    """Replicas of ``actor_class`` with routing, sessions, health checks, respawn and metrics.

    Built by ``ForgeActor.as_service``; endpoints are reached as attributes
    (``svc.generate.route(...)``) or, when a name collides with a service method, with
    ``svc.endpoint("name")``. Use ``async with`` or ``await svc.shutdown()`` to stop it.
    """

    def __init__(self, actor_class: type, args: tuple, kwargs: dict, options: ServiceOptions) -> None:
        self.actor_class = actor_class
        self.options = options
        self.name = options.mesh_name or actor_class.__name__
        self._uid = next(_service_ids)
        self.replicas = [Replica(i, options.max_concurrent_per_replica, options.max_queue_per_replica)
                         for i in range(options.num_replicas)]
        group = resolve_hosts(options.hosts)
        if group is not None and options.backend == "local":
            raise ValueError(f"{self.name}: hosts={options.hosts!r} needs backend='monarch' (the local backend "
                             "runs replicas in this process)")
        self._placement = ReplicaPlacement(group, options.replicas_per_host)
        self._spawner = ReplicaSpawner(actor_class, args, kwargs, options, self.name,
                                       mesh_name(self.name, os.getpid(), self._uid), self._placement)
        self._router, self._session_router = routers_for(options.load_balancing)
        self._sessions = SessionTable(self.name, options.max_sessions, options.session_ttl_s)
        self._endpoints: dict[str, ServiceEndpoint] = {}
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._latency = LatencyWindow()
        self._retries = 0

    @property
    def uid(self) -> int:
        """A number unique to this service in this process (keys its ``session()`` blocks)."""
        return self._uid

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> Service:
        """Spawn every replica (concurrently); if any fails, stop the others and raise ``ReplicaSpawnError``."""
        results = await asyncio.gather(*(self._spawner.spawn(r.index) for r in self.replicas),
                                       return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await asyncio.gather(*(r.stop() for r in results if not isinstance(r, BaseException)),
                                 return_exceptions=True)
            await self.shutdown()
            raise failures[0]
        for replica, handle in zip(self.replicas, results, strict=True):
            self._attach(replica, handle)  # type: ignore[arg-type]
        if self.options.session_ttl_s is not None:
            self.run_in_background(self._reap_sessions_forever())
        return self

    async def shutdown(self) -> None:
        """Stop every replica and background task. Pending and later calls raise ``ServiceClosedError``."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        handles = []
        for replica in self.replicas:
            if replica.handle is not None:
                handles.append(replica.handle.stop())
            replica.slots.fail_waiters(lambda: ServiceClosedError(f"{self.name} was shut down"))
            replica.state = "stopped"
        await asyncio.gather(*handles, return_exceptions=True)
        self._notify_change()

    async def __aenter__(self) -> Service:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def run_in_background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task the service holds (so it is not collected early) and cancels at shutdown."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _attach(self, replica: Replica, handle: ReplicaHandle) -> None:
        replica.attach(handle)
        generation = replica.generation
        handle.watch(lambda reason: self._on_death(replica, generation, reason))
        self._notify_change()

    def _on_death(self, replica: Replica, generation: int, reason: str) -> None:
        if self._closed or replica.generation != generation or replica.state != "healthy":
            return  # an old incarnation, or already handled
        logger.warning("%s replica %d (%s) failed: %s", self.name, replica.index, host_label(replica.handle),
                       reason)
        replica.fail(reason, self.name)
        self._placement.replica_died(getattr(replica.handle, "host", None), reason)
        for record in self._sessions.on_replica(replica.index):
            self._sessions.remove(record.id, lost_reason=f"replica {replica.index} failed: {reason}")
        old = replica.handle
        if old is not None:
            self.run_in_background(old.stop())
        self._notify_change()
        if self.options.respawn:
            self.run_in_background(self._respawn(replica))

    async def _respawn(self, replica: Replica) -> None:
        for attempt in itertools.count():
            if self._closed:
                return
            try:
                handle = await self._spawner.spawn(replica.index)
            except Exception as error:
                delay = _RESPAWN_BACKOFF_S[min(attempt, len(_RESPAWN_BACKOFF_S) - 1)]
                logger.error("%s: respawning replica %d failed (%s); retrying in %.1f s",
                             self.name, replica.index, error, delay)
                await asyncio.sleep(delay)
                continue
            if self._closed:
                await handle.stop()
                return
            replica.stats.respawns += 1
            self._attach(replica, handle)
            logger.info("%s: replica %d respawned (generation %d)", self.name, replica.index, replica.generation)
            return

    def _notify_change(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ----------------------------------------------------------------- picking replicas
    async def _pick(self, for_session: bool = False) -> Replica:
        """The healthy replica the router picks (for a new session: the session router); while none is healthy,
        wait (up to ``replica_wait_s``) for a respawn."""
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise ServiceClosedError(f"{self.name} was shut down")
            healthy = [r for r in self.replicas if r.healthy]
            if healthy:
                return (self._session_router if for_session else self._router).get_replica(healthy)
            if deadline is None:
                deadline = loop.time() + self.options.replica_wait_s
            remaining = deadline - loop.time()
            if remaining <= 0:
                states = ", ".join(f"{r.index}: {r.state} ({r.last_failure or 'no failure recorded'})"
                                   for r in self.replicas)
                raise NoHealthyReplicaError(
                    f"{self.name}: no healthy replica after {self.options.replica_wait_s:g} s ({states})")
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    # ----------------------------------------------------------------- calling
    async def _invoke(self, replica: Replica, endpoint: str, args: tuple, kwargs: dict) -> Any:
        """One call on one replica (see ``Replica.invoke``), timed; ``ReplicaFailedError`` if the replica dies."""
        started = time.perf_counter()
        try:
            return await replica.invoke(endpoint, args, kwargs, self.name, self._on_death)
        finally:
            self._latency.add(time.perf_counter() - started)

    async def route_call(self, endpoint: str, args: tuple, kwargs: dict, session_id: str | None = None) -> Any:
        """``svc.<endpoint>.route``: one healthy replica (a stateless call is retried on another if its replica
        dies), or the replica of ``session_id`` / of the ``session()`` block open in this task."""
        if session_id is None:
            session_id = active_session(self._uid)
        if session_id is not None:
            return await self.call_in_session(session_id, endpoint, args, kwargs)
        for attempt in itertools.count():
            replica = await self._pick()
            try:
                return await self._invoke(replica, endpoint, args, kwargs)
            except ReplicaFailedError as error:
                if self._closed:
                    raise ServiceClosedError(f"{self.name} was shut down during {endpoint}()") from error
                if attempt >= self.options.max_retries:
                    raise
                self._retries += 1
        raise AssertionError("unreachable")

    async def fanout_call(self, endpoint: str, args: tuple, kwargs: dict) -> list[Any]:
        """``svc.<endpoint>.fanout``: every replica, in replica order; a dead one's slot holds its ``ServiceError``."""
        async def one(replica: Replica) -> Any:
            if not replica.healthy:
                return ReplicaFailedError(f"{self.name} replica {replica.index} is {replica.state}"
                                          f" ({replica.last_failure})", replica=replica.index,
                                          reason=replica.last_failure)
            try:
                return await self._invoke(replica, endpoint, args, kwargs)
            except ServiceError as error:
                return error

        if self._closed:
            raise ServiceClosedError(f"{self.name} was shut down")
        results = await asyncio.gather(*(one(r) for r in self.replicas), return_exceptions=True)
        for result in results:  # application errors propagate; replica failures stay in their slots
            if isinstance(result, BaseException) and not isinstance(result, ServiceError):
                raise result
        return results

    # ----------------------------------------------------------------- sessions
    async def open_session(self, session_id: str, *, held: bool = False) -> int:
        """Open session ``session_id`` (placed by the session router) unless it is open; return its replica.

        ``held``: it never expires until released (an open ``session()`` block). ``SessionLimitError`` when
        ``max_sessions`` are open; ``SessionLostError`` if a session of that id was lost.
        """
        return (await self._session_record(session_id, held)).replica

    def session_replica(self, session_id: str) -> int | None:
        """Index of the replica holding the open session ``session_id`` (``None`` if it is not open)."""
        record = self._sessions.open.get(session_id)
        return record.replica if record is not None else None

    async def _session_record(self, session_id: str, held: bool) -> SessionRecord:
        record = self._sessions.get(session_id)
        if record is not None:
            record.held = record.held or held
            return record
        if len(self._sessions) >= self.options.max_sessions:
            await self._reap_expired()  # the background reaper may not have run yet
        self._sessions.check_capacity()
        replica = await self._pick(for_session=True)
        record = self._sessions.get(session_id)  # opened by a concurrent caller while we waited
        if record is not None:
            record.held = record.held or held
            return record
        self._sessions.check_capacity()
        record = SessionRecord(session_id, replica.index, replica.generation, held=held)
        self._sessions.add(record)
        replica.sessions += 1
        return record

    async def call_in_session(self, session_id: str, endpoint: str, args: tuple, kwargs: dict) -> Any:
        """One call on the replica of session ``session_id`` (opened if needed): ``svc.x.route(session_id=...)``
        without the verb, for session clients on the hot path (``RemoteEnv.astep``)."""
        record = self._sessions.open.get(session_id)  # the hot path: an open session, no await, no LRU reorder
        if record is None:
            record = await self._session_record(session_id, held=False)
        replica = self._session_router.replica_of(record, self.replicas)
        if replica is None:
            dead = self.replicas[record.replica]
            self._sessions.remove(session_id, lost_reason=f"replica {dead.index} failed")
            raise SessionLostError(f"{self.name}: session {session_id!r} was on replica {dead.index}, which "
                                   f"failed ({dead.last_failure}); start a new session", session_id=session_id)
        if "session_id" not in kwargs and accepts_session_id(self.actor_class, endpoint):
            kwargs = {**kwargs, "session_id": session_id}
        record.in_flight += 1  # an expiry never takes a session with a call in flight
        try:
            return await self._invoke(replica, endpoint, args, kwargs)
        except ReplicaFailedError as error:
            self._sessions.remove(session_id, lost_reason=str(error))
            raise SessionLostError(f"{self.name}: session {session_id!r} lost: {error}",
                                   session_id=session_id) from error
        finally:
            record.in_flight -= 1
            record.touch()

    def session(self, session_id: str | None = None) -> ServiceSession:
        """``async with svc.session() as s:`` pins every call in the block (``svc.x.route``) to one replica."""
        return ServiceSession(self, session_id)

    async def release_session(self, session_id: str) -> None:
        """End a session: free its slot and, if configured, call ``session_end_endpoint`` on its replica."""
        record = self._sessions.remove(session_id)
        if record is not None:
            await self._end_on_replica(record)

    async def _end_on_replica(self, record: SessionRecord) -> None:
        replica = self.replicas[record.replica]
        if replica.generation != record.generation:
            return
        replica.sessions -= 1
        end = self.options.session_end_endpoint
        if end is None or not replica.healthy or self._closed:
            return
        try:
            await self._invoke(replica, end, (), {"session_id": record.id})
        except Exception as error:  # the session is gone either way; the replica reports its own troubles
            logger.warning("%s: %s(session_id=%r) failed: %s", self.name, end, record.id, error)

    async def _reap_expired(self) -> None:
        for record in self._sessions.expired():
            self._sessions.remove(record.id, lost_reason=f"idle for more than {self.options.session_ttl_s:g} s")
            await self._end_on_replica(record)

    async def _reap_sessions_forever(self) -> None:
        ttl = self.options.session_ttl_s or 1.0
        while not self._closed:
            await asyncio.sleep(min(max(ttl / 4, 0.05), 5.0))
            await self._reap_expired()

    # ----------------------------------------------------------------- introspection
    def endpoint(self, name: str) -> ServiceEndpoint:
        """The endpoint ``name`` (for names that collide with a ``Service`` attribute)."""
        found = self._endpoints.get(name)
        if found is None:
            if name not in endpoint_names(self.actor_class):
                raise AttributeError(unknown_endpoint_message(self.actor_class, name))
            found = self._endpoints[name] = ServiceEndpoint(self, name)
        return found

    def __getattr__(self, name: str) -> ServiceEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.endpoint(name)

    def replica_hosts(self) -> list[str]:
        """The host each replica runs on (``"this_host"``, or ``"<group>[<index>]"``), in replica order."""
        return [host_label(r.handle) for r in self.replicas]

    def replica_pids(self) -> list[list[int]]:
        """The process ids of each replica (in replica order; empty while one is respawning)."""
        return [list(r.handle.pids) if r.handle is not None and r.healthy else [] for r in self.replicas]

    def metrics(self) -> ServiceMetrics:
        """Counters, queue depth and latency percentiles, for the service and each replica."""
        return service_metrics(self.name, self.replicas, self.replica_hosts(), retries=self._retries,
                               latency=self._latency, sessions=len(self._sessions),
                               sessions_lost=self._sessions.lost_count)

    def __repr__(self) -> str:
        healthy = sum(r.healthy for r in self.replicas)
        return (f"<Service {self.name} {healthy}/{len(self.replicas)} healthy, backend={self.options.backend}, "
                f"{'closed' if self._closed else 'open'}>")
