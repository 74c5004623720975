"""The calling verbs of a service: ``svc.x.route`` / ``svc.x.fanout``, and sticky ``svc.session()`` blocks.

The verbs only use the service's public calling API (:class:`ServiceCalls`, which ``Service`` implements);
this module does not import the service.
"""

from __future__ import annotations

import contextvars
import uuid
from typing import Any, Protocol

from forge_env.services.sessions import enter_session, exit_session


class ServiceCalls(Protocol):
    """What the verbs need of a service (``forge_env.services.Service`` is one)."""

    name: str

    @property
    def uid(self) -> int: ...

    def endpoint(self, name: str) -> ServiceEndpoint: ...

    async def route_call(self, endpoint: str, args: tuple, kwargs: dict, session_id: str | None = None) -> Any: ...

    async def fanout_call(self, endpoint: str, args: tuple, kwargs: dict) -> list[Any]: ...

    async def open_session(self, session_id: str, *, held: bool = False) -> int: ...

    async def release_session(self, session_id: str) -> None: ...

    def session_replica(self, session_id: str) -> int | None: ...


class ServiceEndpoint:
    """One endpoint of a service, with its calling verbs."""

    def __init__(self, service: ServiceCalls, name: str) -> None:
        self.service = service
        self.name = name

    async def route(self, *args: Any, session_id: str | None = None, **kwargs: Any) -> Any:
        """Call one healthy replica (inside a ``session()`` block, or with ``session_id=``: the session's replica).

        If the endpoint declares a ``session_id`` parameter, sticky calls pass it the session id.
        """
        return await self.service.route_call(self.name, args, kwargs, session_id)

    async def fanout(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Call every replica; results in replica order, a failed replica's slot holding a ``ServiceError``.

        An application error raised by the endpoint on any replica is raised to the caller.
        """
        return await self.service.fanout_call(self.name, args, kwargs)

    def __repr__(self) -> str:
        return f"<ServiceEndpoint {self.service.name}.{self.name}>"


class ServiceSession:
    """A sticky session: ``async with svc.session() as s`` (calls via ``svc.x.route`` or ``s.x.route``)."""

    def __init__(self, service: ServiceCalls, session_id: str | None = None) -> None:
        self.service = service
        self.id = session_id or uuid.uuid4().hex
        self._token: contextvars.Token[dict[int, str] | None] | None = None

    @property
    def replica(self) -> int | None:
        """Index of the replica holding this session (``None`` once it is closed or lost)."""
        return self.service.session_replica(self.id)

    async def __aenter__(self) -> ServiceSession:
        await self.service.open_session(self.id, held=True)
        self._token = enter_session(self.service.uid, self.id)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._token is not None:
            exit_session(self._token)
            self._token = None
        await self.service.release_session(self.id)

    def __getattr__(self, name: str) -> SessionEndpoint:
        if name.startswith("_"):
            raise AttributeError(name)
        return SessionEndpoint(self.service.endpoint(name), self.id)


class SessionEndpoint:
    """An endpoint bound to one session: ``await s.generate.route(...)``."""

    def __init__(self, endpoint: ServiceEndpoint, session_id: str) -> None:
        self.endpoint = endpoint
        self.session_id = session_id

    async def route(self, *args: Any, **kwargs: Any) -> Any:
        return await self.endpoint.route(*args, session_id=self.session_id, **kwargs)
