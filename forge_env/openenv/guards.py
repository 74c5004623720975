"""Limits on what a hostile client can make ``forge-env serve`` hold: request bodies, JSON shapes, silent sockets.

uvicorn bounds an incoming WebSocket frame (``ws_max_size``) and the idle time between keep-alive requests, but
not an HTTP body's size, nor a connection that never finishes sending its request headers (slowloris): such a
socket is held forever. :func:`header_timeout_protocol` closes it; :func:`read_body` bounds ``POST`` bodies;
:func:`parse_json` turns every way ``json.loads`` can fail on hostile text (deep nesting, a number of more than
4300 digits) into one error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from forge_env.tools.parsed import load_json


class BodyTooLargeError(ValueError):
    """A request body over the server's limit."""


def parse_json(raw: str | bytes) -> Any:
    """``json.loads(raw)``; raises ``ValueError`` for anything it cannot parse, nesting too deep included."""
    value, reason = load_json(raw)  # type: ignore[arg-type]  # json.loads takes bytes too
    if reason is not None:
        raise ValueError(reason)
    return value


async def read_body(request: Any, max_bytes: int, timeout_s: float | None) -> bytes:
    """The body of a starlette ``request``, refused past ``max_bytes`` or after ``timeout_s`` of reading."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLargeError(f"the request body has {int(declared)} bytes; the limit is {max_bytes}")

    async def collect() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLargeError(f"the request body is over the limit of {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async with asyncio.timeout(timeout_s):  # one timer; wait_for would run collect() as a task of its own (3.11)
        return await collect()


def header_timeout_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, closing a connection whose request headers are not complete in ``timeout_s``.

    Covers a connection that sends nothing, one that drips its headers, and a keep-alive connection that starts
    a next request and stalls. Once a request is complete (or the connection became a WebSocket, whose idle TTL
    the app enforces) the timer leaves it alone. It reads uvicorn's ``cycle`` (the request being served): both of
    uvicorn's HTTP implementations have it.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm(None)

        def data_received(self, data: bytes) -> None:
            cycle = getattr(self, "cycle", None)
            if self._header_timer is None and (cycle is None or cycle.response_complete):
                self._arm(cycle)  # a next request on a keep-alive connection: its headers are timed too
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _arm(self, waiting_after: Any) -> None:
            self._header_timer = asyncio.get_running_loop().call_later(timeout_s, self._headers_late, waiting_after)

        def _headers_late(self, waiting_after: Any) -> None:
            self._header_timer = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self:  # closed, or now a WebSocket
                return
            cycle = getattr(self, "cycle", None)
            if cycle is waiting_after:  # no new request started in time
                transport.close()
            elif cycle.response_complete:  # served one since: time whatever comes next on this connection
                self._arm(cycle)

    return HeaderTimeoutProtocol
