"""The WebSocket side of :class:`~forge_env.openenv.client_env.OpenEnvTextEnv`: one connection, its frames,
and the error every failure of it becomes.

A connection belongs to the event loop that opened it; a request from another loop, or over a connection
the server closed, raises :class:`OpenEnvError` (code ``CONNECTION_LOST``, or the error frame the server
sent before closing). A cancelled request drops the connection, so its unread reply is never taken for the
next request's. ``OpenEnvConnection`` is a mixin: the env holds the url, token, timeouts and socket.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from forge_env.core.env import EnvError
from forge_env.openenv import protocol as wire
from forge_env.types import Message

CONNECTION_LOST = "CONNECTION_LOST"
#: Error codes after which the server closes the connection.
CLOSING_CODES = {wire.SESSION_EXPIRED, wire.CAPACITY_REACHED, wire.SERVER_SHUTTING_DOWN}


class OpenEnvError(EnvError):
    """The OpenEnv server answered with an error frame (``code`` says which) or the connection failed."""

    def __init__(self, message: str, code: str | None = None, data: dict[str, Any] | None = None):
        super().__init__(f"{message} (code: {code})" if code else message)
        self.code = code
        self.data = data or {}


def websocket_url(url: str) -> str:
    """``http(s)://host:port[/path]`` (or ``ws(s)://``) as the server's ``/ws`` endpoint, as OpenEnv's clients do."""
    base = url.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if base.startswith(http):
            base = ws + base[len(http):]
    if not base.startswith(("ws://", "wss://")):
        base = "ws://" + base
    return base if base.endswith("/ws") else base + "/ws"


class OpenEnvConnection:
    """Connecting, sending a frame and reading its reply, and dropping the connection (mixin)."""

    async def _connect(self) -> None:
        from websockets.asyncio.client import connect

        await self._drop_connection()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            self._ws = await connect(self.ws_url, additional_headers=headers, max_size=self.max_message_bytes,
                                     open_timeout=self.connect_timeout_s, proxy=None)
        except Exception as error:
            raise OpenEnvError(f"cannot connect to {self.ws_url}: {type(error).__name__}: {error}",
                               CONNECTION_LOST) from error
        self._ws_loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()

    async def _drop_connection(self) -> None:
        ws, loop, self._ws, self._ws_loop = self._ws, self._ws_loop, None, None
        if ws is None:
            return
        if loop is asyncio.get_running_loop():
            try:
                await ws.send(json.dumps({"type": "close"}))
                await ws.close()
            except Exception:  # already closed by the server or the network; nothing to release here
                pass
        elif loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(ws.transport.abort)

    def _connected_here(self) -> bool:
        from websockets.protocol import State

        return (self._ws is not None and self._ws_loop is asyncio.get_running_loop()
                and self._ws.state is State.OPEN)

    async def _request(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send a frame and return the reply's ``data``; an error frame raises :class:`OpenEnvError`."""
        if not self._connected_here():
            if self._ws is not None and self._ws_loop is asyncio.get_running_loop():
                await self._raise_closed_by_server(None)
            raise OpenEnvError("not connected (the connection broke, or belongs to another event loop); "
                               "call areset() to start a new episode", CONNECTION_LOST)
        assert self._lock is not None
        async with self._lock:
            try:
                await self._ws.send(json.dumps(frame))
                reply = json.loads(await asyncio.wait_for(self._ws.recv(), self.message_timeout_s))
            except (asyncio.CancelledError, KeyboardInterrupt):
                await self._drop_connection()  # the reply we did not read would be taken for the next one's
                raise
            except Exception as error:
                await self._raise_closed_by_server(error)
                raise OpenEnvError(f"{frame.get('type')} failed: the connection to {self.ws_url} broke "
                                   f"({type(error).__name__}: {error})", CONNECTION_LOST) from error
        if not isinstance(reply, dict) or not isinstance(reply.get("data") or {}, dict):
            raise OpenEnvError(f"the server sent a frame that is not a JSON object with object data: {reply!r:.200}",
                               wire.MALFORMED_FRAME)
        if reply.get("type") == "error":
            if (reply.get("data") or {}).get("code") in CLOSING_CODES:
                await self._drop_connection()
            raise _error_from(reply)
        return reply.get("data") or {}

    async def _raise_closed_by_server(self, cause: BaseException | None) -> None:
        """Drop a broken connection; raise the error frame the server sent before closing it, if any."""
        last_words = await self._last_frame()
        await self._drop_connection()
        if last_words is not None and last_words.get("type") == "error":
            raise _error_from(last_words) from cause

    async def _last_frame(self) -> dict[str, Any] | None:
        """A frame the server sent before closing (why it closed: an idle TTL, a shutdown), if any."""
        try:
            frame = json.loads(await asyncio.wait_for(self._ws.recv(), 0.2))
        except Exception:
            return None
        return frame if isinstance(frame, dict) else None


def observation_of(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's observation object (``{}`` when absent); anything else is a malformed frame."""
    observation = reply.get("observation") or {}
    if not isinstance(observation, dict):
        raise OpenEnvError(f"the observation is not a JSON object: {observation!r:.100}", wire.MALFORMED_FRAME)
    return observation


def read_reply(reply: dict[str, Any]) -> tuple[list[Message], float, bool, bool, dict[str, Any], list[dict]]:
    """``wire.read_observation`` with a malformed frame as an ``OpenEnvError`` (code ``MALFORMED_FRAME``)."""
    try:
        return wire.read_observation(reply)
    except wire.ProtocolError as error:
        raise OpenEnvError(str(error), error.code) from None


def _error_from(frame: dict[str, Any]) -> OpenEnvError:
    data = frame.get("data") or {}
    return OpenEnvError(f"server error: {data.get('message', 'unknown error')}", data.get("code", "UNKNOWN"), data)
