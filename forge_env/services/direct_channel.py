"""Direct calls: a replica's concurrent endpoints over a Unix socket of its own, beside Monarch.

A Monarch ``call_one`` costs about 0.45 ms of CPU in the caller and as much in the replica, whatever the
call does (measured by ``benchmarks/env_service_bench.py``: its breakdown and CPU rows). For a cheap
environment step that is several times the step itself. So a replica on this machine that was started with
``direct_calls=True`` opens a listening socket (Linux abstract namespace, no file) from inside its actor, on
the actor's own asyncio loop, and hands its address and a random token to the caller through Monarch; the
caller connects once, and calls of the actor's ``@concurrent_endpoint`` methods then travel as length-prefixed
pickles over that socket. Monarch still spawns, places, supervises and pings the replica, and carries every
other call (``setup``, ordinary endpoints, heartbeats).

Semantics are those of the Monarch path:

- each call gets its own result, or the exception its endpoint raised (re-raised in the caller as itself);
- an endpoint that raises ``SystemExit`` ends its replica's process, as it fails a Monarch actor;
- if the replica dies (its process exits, the socket closes), every call waiting on it raises ``ReplicaDown``
  (the service turns that into ``ReplicaFailedError`` / ``SessionLostError``);
- calls made in the same event-loop turn while others are pending travel as one write and their answers come
  back as one (batching); a call made while nothing else is pending is written at once (no added hop).

Only a process that knows the token (given out over Monarch) can make calls; the socket carries pickles, the
same trust as Monarch's own channels on this host.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import os
import pickle
import secrets
import struct
from collections.abc import Callable
from typing import Any

try:
    import cloudpickle as _cloudpickle  # for what plain pickle refuses (a dependency of Monarch's)
except ImportError:  # pragma: no cover
    _cloudpickle = pickle

from forge_env.services.replica import ReplicaDown

HEADER = struct.Struct("!I")  # the frame's length
CALL_ID = struct.Struct("!Q")  # each frame after the token starts with its call's id
MAX_FRAME = (1 << 31) - 1
TOKEN_BYTES = 32
#: A connection that has not sent the token's frame by then is hung up on: any process in the replica's
#: network namespace can connect (the name is listed in /proc/net/unix), and each idle connection would
#: otherwise hold one of the replica's file descriptors for good.
GREETING_TIMEOUT_S = 10.0


def encode(call_id: int, obj: Any) -> bytes:
    """One frame: its length (4 bytes), the call id (8 bytes), the pickle (cloudpickle if pickle refuses ``obj``)."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = _cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    size = CALL_ID.size + len(data)
    if size > MAX_FRAME:
        raise ValueError(f"a direct call's message is {len(data)} bytes; at most {MAX_FRAME} fit in one frame")
    return HEADER.pack(size) + CALL_ID.pack(call_id) + data


def decode(frame: bytes) -> tuple[int, Any]:
    """(call id, unpickled body) of a frame; the id even when the body cannot be unpickled (then the error)."""
    (call_id,) = CALL_ID.unpack_from(frame)
    try:
        return call_id, pickle.loads(memoryview(frame)[CALL_ID.size:])
    except Exception as error:
        return call_id, error


def sendable_error(error: BaseException) -> BaseException:
    """``error``, or a RuntimeError naming it if it cannot be pickled (it would fail the whole reply)."""
    try:
        _cloudpickle.dumps(error)
        return error
    except Exception:
        return RuntimeError(f"{type(error).__qualname__}: {error}")


class _Frames:
    """Cuts a byte stream into frames."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self.buffer
        buffer += data
        frames, position, end = [], 0, len(buffer)
        while end - position >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, position)
            if end - position - HEADER.size < size:
                break
            start = position + HEADER.size
            frames.append(bytes(buffer[start:start + size]))
            position = start + size
        if position:
            del buffer[:position]
        return frames


class _Outbox:
    """Frames written at once when nothing else is pending, else gathered and written once per loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.frames: list[bytes] = []
        self.scheduled = False
        self.writes = 0

    def send(self, frame: bytes, alone: bool) -> None:
        if alone and not self.frames:
            self._write(frame)
            return
        self.frames.append(frame)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        if self.frames:
            frames, self.frames = self.frames, []
            self._write(b"".join(frames))

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.writes += 1


# ----------------------------------------------------------------------------- the replica's end
class _Server(asyncio.Protocol):
    """One caller's connection to a replica: runs each call as a task on the actor's loop, answers by call id."""

    def __init__(self, actor: Any, token: bytes, resolve: Callable[[type, str], tuple[Callable[..., Any], bool]]
                 ) -> None:
        self.actor = actor
        self.token = token
        self.resolve = resolve
        self.loop = asyncio.get_running_loop()
        self.frames = _Frames()
        self.outbox = _Outbox(self.loop)
        self.greeting = bytearray()  # the caller's first bytes, until they hold the token's frame
        self.trusted = False
        self.running = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.outbox.transport = transport  # type: ignore[assignment]
        self.greeting_timer = self.loop.call_later(GREETING_TIMEOUT_S, self._no_greeting)

    def _no_greeting(self) -> None:
        if not self.trusted:
            self.outbox.transport.close()  # type: ignore[union-attr]

    def connection_lost(self, exc: Exception | None) -> None:
        self.greeting_timer.cancel()
        for task in self.tasks:
            task.cancel()  # the caller is gone; nobody waits for these answers

    def data_received(self, data: bytes) -> None:
        if not self.trusted:  # the first frame must be the token: nothing else is read (or buffered) before it
            self.greeting += data
            greeting_size = HEADER.size + TOKEN_BYTES
            if len(self.greeting) < greeting_size:
                return
            expected = HEADER.pack(TOKEN_BYTES) + self.token
            if not hmac.compare_digest(bytes(self.greeting[:greeting_size]), expected):
                self.outbox.transport.close()  # type: ignore[union-attr]
                return
            self.trusted = True
            self.greeting_timer.cancel()
            data, self.greeting = bytes(self.greeting[greeting_size:]), bytearray()
        for frame in self.frames.feed(data):
            call_id, body = decode(frame)
            if isinstance(body, Exception):  # e.g. an argument's class the replica cannot import
                self.outbox.send(encode(call_id, (False, sendable_error(body))), alone=self.running == 0)
                continue
            name, args, kwargs = body
            self.running += 1
            task = self.loop.create_task(self._run(call_id, name, args, kwargs))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run(self, call_id: int, name: str, args: tuple, kwargs: dict) -> None:
        try:
            method, concurrent = self.resolve(type(self.actor), name)
            if not concurrent:
                raise ValueError(f"{type(self.actor).__qualname__}.{name} is not a concurrent endpoint; "
                                 "it cannot be called directly")
            reply: tuple[bool, Any] = (True, await method(self.actor, *args, **kwargs))
        except SystemExit as exit_:  # as on Monarch, where it fails the actor: the replica is gone
            os._exit(exit_.code if isinstance(exit_.code, int) else 1)
        except Exception as error:  # one call's error is its own
            reply = (False, sendable_error(error))
        self.running -= 1
        try:
            frame = encode(call_id, reply)
        except Exception as error:
            frame = encode(call_id, (False, RuntimeError(f"{name}() returned a value that cannot be sent: {error}")))
        self.outbox.send(frame, alone=self.running == 0)


async def serve(actor: Any, resolve: Callable[[type, str], tuple[Callable[..., Any], bool]]) -> tuple[str, bytes]:
    """Listen for direct calls to ``actor`` (once per actor; later calls return the same); (address, token)."""
    existing = getattr(actor, "_forge_direct_address", None)
    if existing is not None:
        return existing
    token = secrets.token_bytes(TOKEN_BYTES)
    address = f"\0forge_env_direct_{os.getpid()}_{secrets.token_hex(8)}"
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _Server(actor, token, resolve), address)
    actor._forge_direct_server = server  # kept alive as long as the actor
    actor._forge_direct_address = (address, token)
    return address, token


# ----------------------------------------------------------------------------- the caller's end
class DirectChannel(asyncio.Protocol):
    """The caller's end of one replica's socket: ``await channel.call(endpoint, args, kwargs, batch)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.frames = _Frames()
        self.outbox = _Outbox(loop)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count()
        self.closed: str | None = None

    @classmethod
    async def connect(cls, address: str, token: bytes) -> DirectChannel:
        loop = asyncio.get_running_loop()
        channel = cls(loop)
        await loop.create_unix_connection(lambda: channel, address)
        channel.outbox.send(HEADER.pack(len(token)) + token, alone=True)
        channel.outbox.writes = 0
        return channel

    @property
    def messages(self) -> int:
        """Writes made (a batch of calls is one)."""
        return self.outbox.writes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.outbox.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for frame in self.frames.feed(data):
            call_id, body = decode(frame)
            future = self.pending.pop(call_id, None)
            if future is None or future.done():
                continue  # its caller was cancelled
            if isinstance(body, Exception):  # the answer cannot be unpickled here
                future.set_exception(body)
                continue
            ok, value = body
            if ok:
                future.set_result(value)
            elif isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_exception(RuntimeError(f"malformed error reply: {value!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = f"its direct channel closed ({exc or 'end of stream'})"
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ReplicaDown(self.closed))

    async def call(self, endpoint: str, args: tuple, kwargs: dict, batch: bool = True) -> Any:
        """Call ``endpoint``; its exception is re-raised as itself, ``ReplicaDown`` if the replica is gone."""
        if self.closed is not None:
            raise ReplicaDown(self.closed)
        call_id = next(self.ids)
        frame = encode(call_id, (endpoint, args, kwargs))
        future = self.loop.create_future()
        alone = not batch or not self.pending
        self.pending[call_id] = future
        self.outbox.send(frame, alone=alone)
        try:
            return await future
        finally:
            self.pending.pop(call_id, None)

    def close(self) -> None:
        transport = self.outbox.transport
        if transport is not None:
            transport.close()
