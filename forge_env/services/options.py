"""How an actor class is deployed: processes, replicas, routing and limits.

``ForgeActor.options(**kwargs)`` fills a :class:`ServiceOptions`; unknown keywords are
refused with the list of valid ones, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from forge_env.services.routing import check_load_balancing

Backend = Literal["monarch", "local"]
LoadBalancing = Literal["least_loaded", "round_robin"]
Heartbeat = Literal["remote", "always", "off"]


@dataclass(frozen=True)
class ServiceOptions:
    """Deployment of one actor class as an actor (``as_actor``) or a service (``as_service``).

    Args:
        procs: processes per replica (an actor mesh of this size; ``as_actor`` spawns one).
        hosts: where the replicas run: ``None`` (this host, the default), the name of a host
            group registered from a Monarch job (``forge_env.services.placement.use_job``), a
            ``HostGroup`` or a Monarch ``HostMesh``. Replicas are spread over the group's hosts.
        replicas_per_host: at most this many replicas of the service on one host (``None``: no cap);
            bounds where replicas of a dead host may be respawned.
        spawn_timeout_s: a replica that has not started within this long counts as failed to
            spawn (on another host, its host is marked dead).
        heartbeat: when to ping replicas to notice a dead or unreachable host: ``"remote"`` (replicas
            whose processes this machine cannot watch), ``"always"`` or ``"off"``.
        heartbeat_interval_s / heartbeat_timeout_s: how often to ping, and how long an answer may take
            before an idle replica counts as dead.
        heartbeat_busy_timeout_s: how long a replica with calls in flight may stay silent (an endpoint
            that blocks its actor's event loop, e.g. a train step, cannot answer pings meanwhile).
        with_gpus: give each process its own GPU (``CUDA_VISIBLE_DEVICES``); otherwise
            processes are CPU-only (``CUDA_VISIBLE_DEVICES=""``).
        num_replicas: replicas of a service (each its own process mesh).
        mesh_name: name prefix of the spawned meshes (default: the class name).
        backend: ``"monarch"`` (real processes) or ``"local"`` (in this process, for
            debugging and fast unit tests; same API).
        load_balancing: which routers pick replicas (:mod:`forge_env.services.routing`):
            ``"least_loaded"`` (fewest calls in flight + queued; a new session goes to the replica with
            the fewest sessions) or ``"round_robin"``. An unknown name is refused with close matches.
        max_concurrent_per_replica: calls in flight on one replica; more wait in its queue.
        max_queue_per_replica: calls that may wait per replica (``None``: unbounded); beyond
            it ``ServiceOverloadedError`` is raised.
        max_sessions: open sticky sessions per service; beyond it ``SessionLimitError``.
        session_ttl_s: a session idle this long is released (``None``: never).
        session_end_endpoint: endpoint called on the replica (with ``session_id=``) when a
            session ends, so the replica can drop that session's state.
        max_retries: how many times ``route`` retries a stateless call after its replica failed.
        replica_wait_s: how long a call waits for a healthy replica while all are respawning.
        respawn: respawn failed replicas in the background.
        batch_calls: on Monarch, calls of a ``@concurrent_endpoint`` made in the same event-loop turn go to a
            replica as one message (each keeps its own result or exception); ``False`` sends each alone.
        direct_calls: calls of a ``@concurrent_endpoint`` (of an actor whose endpoints are all async) to a replica
            on this machine travel over a Unix socket the replica opens beside Monarch, a fraction of a Monarch
            call's cost (:mod:`~forge_env.services.direct_channel`); same results, errors and failure handling.
            ``EnvService`` turns it on; off by default (payloads are pickled, with no Monarch tensor handling).
        env: extra environment variables for the replica processes.
    """

    procs: int = 1
    hosts: Any = None
    replicas_per_host: int | None = None
    spawn_timeout_s: float = 120.0
    heartbeat: Heartbeat = "remote"
    heartbeat_interval_s: float = 5.0
    heartbeat_timeout_s: float = 30.0
    heartbeat_busy_timeout_s: float = 900.0
    with_gpus: bool = False
    num_replicas: int = 1
    mesh_name: str | None = None
    backend: Backend = "monarch"
    load_balancing: LoadBalancing = "least_loaded"
    max_concurrent_per_replica: int = 64
    max_queue_per_replica: int | None = None
    max_sessions: int = 1024
    session_ttl_s: float | None = 600.0
    session_end_endpoint: str | None = None
    max_retries: int = 2
    replica_wait_s: float = 60.0
    respawn: bool = True
    batch_calls: bool = True
    direct_calls: bool = False
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.procs < 1:
            raise ValueError(f"procs must be at least 1, got {self.procs}")
        if isinstance(self.hosts, (int, float)) and not isinstance(self.hosts, bool):
            raise ValueError(f"hosts={self.hosts!r}: name a host group (e.g. hosts='cpu' from a Monarch job), "
                             "pass a HostMesh, or leave it None for this host")
        if self.replicas_per_host is not None and self.replicas_per_host < 1:
            raise ValueError(f"replicas_per_host must be at least 1 or None, got {self.replicas_per_host}")
        if self.spawn_timeout_s <= 0:
            raise ValueError(f"spawn_timeout_s must be positive, got {self.spawn_timeout_s}")
        if self.heartbeat not in ("remote", "always", "off"):
            raise ValueError(f"heartbeat must be 'remote', 'always' or 'off', got {self.heartbeat!r}")
        if min(self.heartbeat_interval_s, self.heartbeat_timeout_s, self.heartbeat_busy_timeout_s) <= 0:
            raise ValueError("heartbeat_interval_s, heartbeat_timeout_s and heartbeat_busy_timeout_s must be positive")
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {self.num_replicas}")
        if self.backend not in ("monarch", "local"):
            raise ValueError(f"backend must be 'monarch' or 'local', got {self.backend!r}")
        check_load_balancing(self.load_balancing)
        if self.max_concurrent_per_replica < 1:
            raise ValueError(f"max_concurrent_per_replica must be at least 1, got {self.max_concurrent_per_replica}")
        if self.max_queue_per_replica is not None and self.max_queue_per_replica < 0:
            raise ValueError(f"max_queue_per_replica must be >= 0 or None, got {self.max_queue_per_replica}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {self.max_sessions}")
        if self.session_ttl_s is not None and self.session_ttl_s <= 0:
            raise ValueError(f"session_ttl_s must be positive or None, got {self.session_ttl_s}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")

    def replace(self, **changes: Any) -> ServiceOptions:
        """A copy with ``changes`` applied; unknown names raise ``TypeError`` listing the valid ones."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        if unknown:
            raise TypeError(f"unknown service option(s) {unknown}; valid options: {sorted(valid)}")
        return dataclasses.replace(self, **changes)
