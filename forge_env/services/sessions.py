"""The table of sticky sessions: which replica each session lives on, bounded in count and idle time.

A session that is released explicitly disappears (its id may be used again for a new
session). A session that expires or whose replica died leaves a tombstone, so a later
call with its id raises ``SessionLostError`` instead of quietly starting over on
another replica without the state.

Which session an ``async with service.session():`` block opened is a context variable
(:func:`active_session`), so tasks created inside the block inherit it.
"""

from __future__ import annotations

import contextvars
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from forge_env.services.errors import SessionLimitError, SessionLostError

TOMBSTONES = 4096

# service uid -> session id of the innermost open ``session()`` block, per task
_active_sessions: contextvars.ContextVar[dict[int, str] | None] = contextvars.ContextVar(
    "forge_env_service_sessions", default=None)


def active_session(service_uid: int) -> str | None:
    """The session of the innermost ``session()`` block of service ``service_uid`` open in this task, if any."""
    return (_active_sessions.get() or {}).get(service_uid)


def enter_session(service_uid: int, session_id: str) -> contextvars.Token[dict[int, str] | None]:
    """Make ``session_id`` this task's session of service ``service_uid``; :func:`exit_session` undoes it."""
    current = dict(_active_sessions.get() or {})
    current[service_uid] = session_id
    return _active_sessions.set(current)


def exit_session(token: contextvars.Token[dict[int, str] | None]) -> None:
    _active_sessions.reset(token)


@dataclass
class SessionRecord:
    """One open session. ``held``: inside an open ``async with service.session()`` block (never expires)."""

    id: str
    replica: int
    generation: int
    held: bool = False
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        self.last_used = time.monotonic()


class SessionTable:
    """Open sessions in least-recently-used order, plus tombstones of lost ones."""

    def __init__(self, service_name: str, max_sessions: int, ttl_s: float | None) -> None:
        self.service_name = service_name
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.open: OrderedDict[str, SessionRecord] = OrderedDict()
        self.lost: OrderedDict[str, str] = OrderedDict()
        self.lost_count = 0

    def __len__(self) -> int:
        return len(self.open)

    def get(self, session_id: str) -> SessionRecord | None:
        """The open session, ``None`` if there is none; ``SessionLostError`` if it was lost or expired."""
        record = self.open.get(session_id)
        if record is not None:
            self.open.move_to_end(session_id)
            return record
        reason = self.lost.get(session_id)
        if reason is not None:
            raise SessionLostError(f"{self.service_name}: session {session_id!r} is gone ({reason}); "
                                   "start a new session", session_id=session_id)
        return None

    def check_capacity(self) -> None:
        if len(self.open) >= self.max_sessions:
            raise SessionLimitError(
                f"{self.service_name} holds {len(self.open)} open sessions (max_sessions={self.max_sessions}); "
                "release finished ones (leave their session() block or call release_session) or raise max_sessions")

    def add(self, record: SessionRecord) -> None:
        self.open[record.id] = record
        self.lost.pop(record.id, None)

    def remove(self, session_id: str, lost_reason: str | None = None) -> SessionRecord | None:
        """Drop a session; with ``lost_reason`` a tombstone remembers why.

        A session counts as lost once: a call in flight when its replica died removes it again
        after the death handler did, and that second removal changes nothing.
        """
        record = self.open.pop(session_id, None)
        if lost_reason is not None and (record is not None or session_id not in self.lost):
            self.lost[session_id] = lost_reason
            self.lost_count += 1
            while len(self.lost) > TOMBSTONES:
                self.lost.popitem(last=False)
        return record

    def expired(self) -> list[SessionRecord]:
        """Sessions idle longer than the TTL (none in flight, none held by an open block)."""
        if self.ttl_s is None:
            return []
        cutoff = time.monotonic() - self.ttl_s
        return [r for r in self.open.values() if r.last_used < cutoff and not r.in_flight and not r.held]

    def on_replica(self, index: int) -> list[SessionRecord]:
        return [r for r in self.open.values() if r.replica == index]
