"""A service: replicas of one actor class behind route / fanout / session.

``svc.<endpoint>.route(...)`` sends a call to one healthy replica (least-loaded or
round-robin), ``svc.<endpoint>.fanout(...)`` to every replica, and calls made inside
``async with svc.session():`` (or with ``session_id=``) all land on the replica that
holds that session. Each replica runs at most ``max_concurrent_per_replica`` calls at
once; the rest wait in its FIFO queue.

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
from typing import Any

from forge_env.services.endpoints import accepts_session_id, endpoint_names, unknown_endpoint_message
from forge_env.services.errors import (
    HostUnreachableError,
    NoHealthyReplicaError,
    ReplicaFailedError,
    ReplicaSpawnError,
    ServiceClosedError,
    ServiceError,
    SessionLostError,
)
from forge_env.services.metrics import LatencyWindow, ReplicaMetrics, ServiceMetrics
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import PlacementError, ReplicaPlacement, resolve_hosts
from forge_env.services.replica import Replica, ReplicaDown, ReplicaHandle
from forge_env.services.sessions import SessionRecord, SessionTable
from forge_env.services.spawning import host_label, mesh_name, spawn_handle
from forge_env.services.verbs import ServiceEndpoint, ServiceSession, _open_sessions

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
        self._mesh_prefix = mesh_name(self.name, os.getpid(), self._uid)
        self._args = args
        self._kwargs = kwargs
        self.replicas = [Replica(i, options.max_concurrent_per_replica, options.max_queue_per_replica)
                         for i in range(options.num_replicas)]
        group = resolve_hosts(options.hosts)
        if group is not None and options.backend == "local":
            raise ValueError(f"{self.name}: hosts={options.hosts!r} needs backend='monarch' (the local backend "
                             "runs replicas in this process)")
        self._placement = ReplicaPlacement(group, options.replicas_per_host)
        self._sessions = SessionTable(self.name, options.max_sessions, options.session_ttl_s)
        self._endpoints: dict[str, ServiceEndpoint] = {}
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rotation = 0
        self._closed = False
        self._latency = LatencyWindow()
        self._requests = 0
        self._errors = 0
        self._retries = 0
        self._respawns = 0
        self._spawns = 0

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> Service:
        """Spawn every replica (concurrently); if any fails, stop the others and raise ``ReplicaSpawnError``."""
        results = await asyncio.gather(*(self._spawn(r) for r in self.replicas), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await asyncio.gather(*(r.stop() for r in results if not isinstance(r, BaseException)),
                                 return_exceptions=True)
            await self.shutdown()
            raise failures[0]
        for replica, handle in zip(self.replicas, results, strict=True):
            self._attach(replica, handle)  # type: ignore[arg-type]
        if self.options.session_ttl_s is not None:
            self._background(self._reap_sessions_forever())
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

    def _background(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _spawn(self, replica: Replica) -> ReplicaHandle:
        """Spawn ``replica`` on the host its placement picks; a host that does not answer is marked dead and
        the next one tried."""
        placement = self._placement
        while True:
            # a fresh name per attempt: Monarch may still hold a mesh of that name on a host that vanished
            self._spawns += 1
            name = mesh_name(self._mesh_prefix, "r", replica.index, "s", self._spawns)
            try:
                host = placement.choose(replica.index)
            except PlacementError as error:
                raise ReplicaSpawnError(f"{self.name}: {error}") from error
            target = None if host is None else (placement.group, host)
            try:
                handle = await spawn_handle(self.actor_class, self._args, self._kwargs, self.options, name, target)
            except HostUnreachableError as error:
                placement.release(replica.index)
                if host is None:
                    raise
                placement.host_unreachable(host, str(error))
                continue
            except BaseException:
                placement.release(replica.index)
                raise
            placement.spawned(host)
            handle.host = host  # type: ignore[attr-defined]
            handle.host_label = placement.label(host)  # type: ignore[attr-defined]
            return handle

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
            self._background(old.stop())
        self._notify_change()
        if self.options.respawn:
            self._background(self._respawn(replica))

    async def _respawn(self, replica: Replica) -> None:
        for attempt in itertools.count():
            if self._closed:
                return
            try:
                handle = await self._spawn(replica)
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
            self._respawns += 1
            self._attach(replica, handle)
            logger.info("%s: replica %d respawned (generation %d)", self.name, replica.index, replica.generation)
            return

    def _notify_change(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ----------------------------------------------------------------- picking replicas
    def _rotated(self, replicas: list[Replica]) -> list[Replica]:
        self._rotation += 1
        start = self._rotation % len(replicas)
        return replicas[start:] + replicas[:start]

    def _choose(self, healthy: list[Replica], for_session: bool) -> Replica:
        candidates = self._rotated(healthy)  # rotation breaks ties so idle replicas share the work
        if self.options.load_balancing == "round_robin":
            return candidates[0]
        if for_session:
            return min(candidates, key=lambda r: (r.sessions, r.load))
        return min(candidates, key=lambda r: r.load)

    async def _pick(self, for_session: bool = False) -> Replica:
        """A healthy replica; while none is healthy, wait (up to ``replica_wait_s``) for a respawn."""
        deadline: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise ServiceClosedError(f"{self.name} was shut down")
            healthy = [r for r in self.replicas if r.healthy]
            if healthy:
                return self._choose(healthy, for_session)
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
        """One call on one replica: wait for a slot, run it, count it. ``ReplicaFailedError`` if the replica dies."""
        handle, generation = replica.handle, replica.generation
        who = f"{self.name} replica {replica.index}"
        started = time.perf_counter()
        self._requests += 1
        replica.stats.requests += 1
        slots = replica.slots
        await slots.acquire(who)
        try:
            if replica.generation != generation or not replica.healthy or handle is None:
                raise ReplicaFailedError(f"{who} failed: {replica.last_failure}", replica=replica.index,
                                         reason=replica.last_failure)
            call = asyncio.ensure_future(handle.call(endpoint, args, kwargs))
            replica.calls.add(call)
            try:
                return await call
            except asyncio.CancelledError:
                task = asyncio.current_task()
                # cancelled by Replica.fail (the replica died; it may even be respawned already), not by our caller
                if call.cancelled() and (replica.generation != generation or not replica.healthy) and (
                        task is None or not task.cancelling()):
                    raise ReplicaFailedError(f"{who} failed during {endpoint}(): {replica.last_failure}",
                                             replica=replica.index, reason=replica.last_failure) from None
                raise
            except ReplicaDown as down:
                self._on_death(replica, generation, str(down))
                raise ReplicaFailedError(f"{who} failed during {endpoint}(): {down}", replica=replica.index,
                                         reason=str(down)) from None
            except Exception:
                self._errors += 1
                replica.stats.errors += 1
                raise
            finally:
                replica.calls.discard(call)
        finally:
            slots.release()
            self._latency.add(time.perf_counter() - started)

    async def _route(self, endpoint: str, args: tuple, kwargs: dict, session_id: str | None) -> Any:
        if session_id is None:
            session_id = (_open_sessions.get() or {}).get(self._uid)
        if session_id is not None:
            return await self._call_in_session(session_id, endpoint, args, kwargs)
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

    async def _fanout(self, endpoint: str, args: tuple, kwargs: dict) -> list[Any]:
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
    async def _open_session(self, session_id: str, held: bool) -> SessionRecord:
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

    async def _call_in_session(self, session_id: str, endpoint: str, args: tuple, kwargs: dict) -> Any:
        record = await self._open_session(session_id, held=False)
        replica = self.replicas[record.replica]
        if replica.generation != record.generation or not replica.healthy:
            self._sessions.remove(session_id, lost_reason=f"replica {replica.index} failed")
            raise SessionLostError(f"{self.name}: session {session_id!r} was on replica {replica.index}, which "
                                   f"failed ({replica.last_failure}); start a new session", session_id=session_id)
        if "session_id" not in kwargs and accepts_session_id(self.actor_class, endpoint):
            kwargs = {**kwargs, "session_id": session_id}
        record.in_flight += 1
        record.touch()
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
        p50, p90, p99 = self._latency.percentiles_ms(50, 90, 99)
        replicas = [ReplicaMetrics(
            index=r.index, state=r.state, generation=r.generation, host=host_label(r.handle),
            pids=list(r.handle.pids) if r.handle is not None else [], in_flight=r.slots.in_use,
            queue_depth=r.slots.queued, sessions=r.sessions, requests=r.stats.requests, errors=r.stats.errors,
            failures=r.stats.failures, respawns=r.stats.respawns, last_failure=r.last_failure,
        ) for r in self.replicas]
        return ServiceMetrics(
            name=self.name, requests=self._requests, errors=self._errors,
            failures=sum(r.failures for r in replicas), retries=self._retries, respawns=self._respawns,
            healthy_replicas=sum(r.healthy for r in self.replicas), in_flight=sum(r.in_flight for r in replicas),
            queue_depth=sum(r.queue_depth for r in replicas), sessions=len(self._sessions),
            sessions_lost=self._sessions.lost_count, latency_p50_ms=p50, latency_p90_ms=p90, latency_p99_ms=p99,
            replicas=replicas,
        )

    def __repr__(self) -> str:
        healthy = sum(r.healthy for r in self.replicas)
        return (f"<Service {self.name} {healthy}/{len(self.replicas)} healthy, backend={self.options.backend}, "
                f"{'closed' if self._closed else 'open'}>")
