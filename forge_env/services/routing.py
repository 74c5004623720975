"""Routers: which healthy replica takes a call. Each policy is a small class behind one protocol.

A :class:`Router` picks one of the healthy replicas (never an empty list: the service waits for a
respawn before it asks). Stateless ``route`` calls use the service's router; a new sticky session
is placed by its :class:`SessionRouter`, which then keeps every call of that session on the replica
incarnation it was opened on and never moves it (a dead replica loses its sessions).

``ServiceOptions.load_balancing`` names the pair (see :data:`LOAD_BALANCING`):

- ``"least_loaded"`` (default): :class:`LeastLoadedRouter` for calls (fewest calls in flight plus
  queued); new sessions go to the replica with the fewest sessions, then the least load
  (:class:`FewestSessionsRouter`).
- ``"round_robin"``: :class:`RoundRobinRouter` for calls and new sessions alike (one shared turn).

Ties are broken by a rotating start, so idle replicas share the work.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Protocol

from forge_env.services.replica import Replica
from forge_env.services.sessions import SessionRecord


class Router(Protocol):
    """A load-balancing policy: the replica (one of ``healthy``, never empty) that takes the next call."""

    def get_replica(self, healthy: Sequence[Replica]) -> Replica: ...


class _Rotating:
    """Starts each pick one replica further, so ties go round instead of always to the first."""

    def __init__(self) -> None:
        self._turn = 0

    def _rotated(self, healthy: Sequence[Replica]) -> list[Replica]:
        if not healthy:
            raise ValueError(f"{type(self).__name__}: no healthy replica to choose from")
        self._turn += 1
        start = self._turn % len(healthy)
        return [*healthy[start:], *healthy[:start]]


class RoundRobinRouter(_Rotating):
    """Each call to the next replica in turn."""

    def get_replica(self, healthy: Sequence[Replica]) -> Replica:
        return self._rotated(healthy)[0]


class LeastLoadedRouter(_Rotating):
    """The replica with the fewest calls in flight plus queued (``Replica.load``)."""

    def get_replica(self, healthy: Sequence[Replica]) -> Replica:
        return min(self._rotated(healthy), key=lambda r: r.load)


class FewestSessionsRouter(_Rotating):
    """The replica holding the fewest sticky sessions, then the least loaded: where a new session goes."""

    def get_replica(self, healthy: Sequence[Replica]) -> Replica:
        return min(self._rotated(healthy), key=lambda r: (r.sessions, r.load))


class SessionRouter:
    """Session-sticky routing: a new session is placed by ``fallback``; its calls stay on that replica.

    The session table (:class:`~forge_env.services.sessions.SessionTable`) remembers where each session
    lives; :meth:`replica_of` answers for an open one, ``None`` once its replica died or was respawned
    (the session's state is gone: the service raises ``SessionLostError``, never moves it silently).
    """

    def __init__(self, fallback: Router) -> None:
        self.fallback = fallback

    def get_replica(self, healthy: Sequence[Replica]) -> Replica:
        """Where a new session goes."""
        return self.fallback.get_replica(healthy)

    @staticmethod
    def replica_of(record: SessionRecord, replicas: Sequence[Replica]) -> Replica | None:
        """The replica holding the open session ``record``, if it is still the healthy incarnation it was opened on."""
        replica = replicas[record.replica]
        if replica.generation != record.generation or not replica.healthy:
            return None
        return replica


def _least_loaded() -> tuple[Router, SessionRouter]:
    return LeastLoadedRouter(), SessionRouter(FewestSessionsRouter())


def _round_robin() -> tuple[Router, SessionRouter]:
    router = RoundRobinRouter()
    return router, SessionRouter(router)


#: ``ServiceOptions.load_balancing`` name -> a factory of (router for calls, router for new sessions).
LOAD_BALANCING: dict[str, Callable[[], tuple[Router, SessionRouter]]] = {
    "least_loaded": _least_loaded,
    "round_robin": _round_robin,
}


def check_load_balancing(name: object) -> None:
    """Raise ``ValueError`` (with close matches) unless ``name`` is a key of :data:`LOAD_BALANCING`."""
    if isinstance(name, str) and name in LOAD_BALANCING:
        return
    close = difflib.get_close_matches(name, list(LOAD_BALANCING), n=3) if isinstance(name, str) else []
    hint = f"; did you mean {close}?" if close else ""
    raise ValueError(f"unknown load_balancing {name!r}{hint} (valid: {sorted(LOAD_BALANCING)})")


def routers_for(load_balancing: str) -> tuple[Router, SessionRouter]:
    """Fresh routers for ``load_balancing`` (each service keeps its own turn): (calls, new sessions)."""
    check_load_balancing(load_balancing)
    return LOAD_BALANCING[load_balancing]()
