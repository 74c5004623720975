"""Errors raised by services.

Application errors raised inside an endpoint are NOT wrapped in these types: they reach
the caller as the exception the endpoint raised. These types describe what the
service layer itself decided: a replica died, a session is gone, the service is full.
"""

from __future__ import annotations


class ServiceError(RuntimeError):
    """Base class of errors raised by the service layer (never by an endpoint's own code)."""


class ReplicaFailedError(ServiceError):
    """A replica's process died or its actor failed while serving a call.

    ``route`` retries stateless calls on another replica before giving up with this error;
    ``fanout`` puts an instance of it in the failed replica's slot instead of raising.
    """

    def __init__(self, message: str, *, replica: int | None = None, reason: str = ""):
        super().__init__(message)
        self.replica = replica
        self.reason = reason


class SessionLostError(ServiceError):
    """The session's replica died (or the session expired), so its state is gone.

    The service never moves a session to another replica silently; the caller decides
    what to do (for an episode: drop it and start a new one).
    """

    def __init__(self, message: str, *, session_id: str | None = None):
        super().__init__(message)
        self.session_id = session_id


class SessionLimitError(ServiceError):
    """The service already holds ``max_sessions`` open sessions; release some (leave their ``session()`` block)."""


class NoHealthyReplicaError(ServiceError):
    """No replica became healthy within ``replica_wait_s`` (all are dead and respawning, or respawn keeps failing)."""


class ServiceOverloadedError(ServiceError):
    """A replica's queue is full (``max_queue_per_replica``); back off and retry, or add replicas."""


class ServiceClosedError(ServiceError):
    """The service was shut down; create a new one."""


class ReplicaSpawnError(ServiceError):
    """Spawning a replica (its processes, actor or ``setup`` endpoint) failed."""


class HostUnreachableError(ReplicaSpawnError):
    """A replica could not be spawned because its host did not answer in time (the host is marked dead)."""
