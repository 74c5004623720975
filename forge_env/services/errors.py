"""Errors raised by services.

Application errors raised inside an endpoint are NOT wrapped in these types: they reach
the caller as the exception the endpoint raised. These types describe what the
service layer itself decided: a replica died, a session is gone, the service is full.

Those that are failures of the machine also derive from :class:`~forge_env.errors.InfraError`, so an
episode they end is masked as ``infra_error`` (see :mod:`forge_env.errors`): ``ReplicaFailedError``,
``SessionLostError``, ``NoHealthyReplicaError``, ``ServiceOverloadedError`` and ``HostUnreachableError``.
``SessionLimitError``, ``ServiceClosedError`` and ``ReplicaSpawnError`` itself are the caller's doing
(too many sessions held, a service shut down, a ``setup()`` that raises or asks for GPUs the host lacks).
"""

from __future__ import annotations

from forge_env.errors import InfraError


class ServiceError(RuntimeError):
    """Base class of errors raised by the service layer (never by an endpoint's own code).

    Not itself an ``InfraError``: only the subclasses that mean the machine failed are (see the module docstring).
    """


class ReplicaFailedError(ServiceError, InfraError):
    """A replica's process died or its actor failed while serving a call.

    ``route`` retries stateless calls on another replica before giving up with this error;
    ``fanout`` puts an instance of it in the failed replica's slot instead of raising.
    """

    def __init__(self, message: str, *, replica: int | None = None, reason: str = ""):
        super().__init__(message)
        self.replica = replica
        self.reason = reason


class SessionLostError(ServiceError, InfraError):
    """The session's replica died (or the session expired), so its state is gone.

    The service never moves a session to another replica silently; the caller decides
    what to do (for an episode: ``RemoteEnv`` resumes it on another replica from the snapshot it holds when the
    environment snapshots, and says so in the step's info; otherwise the episode is dropped).
    """

    def __init__(self, message: str, *, session_id: str | None = None):
        super().__init__(message)
        self.session_id = session_id


class SessionLimitError(ServiceError):
    """The service already holds ``max_sessions`` open sessions; release some (leave their ``session()`` block)."""


class NoHealthyReplicaError(ServiceError, InfraError):
    """No replica became healthy within ``replica_wait_s`` (all are dead and respawning, or respawn keeps failing)."""


class ServiceOverloadedError(ServiceError, InfraError):
    """A replica's queue is full (``max_queue_per_replica``); back off and retry, or add replicas."""


class ServiceClosedError(ServiceError):
    """The service was shut down; create a new one."""


class ReplicaSpawnError(ServiceError):
    """Spawning a replica (its processes, actor or ``setup`` endpoint) failed."""


class HostUnreachableError(ReplicaSpawnError, InfraError):
    """A replica could not be spawned because its host did not answer in time (the host is marked dead)."""
