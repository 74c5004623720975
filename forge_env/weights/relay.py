"""Weights across hosts without a shared file system: chunks over Monarch, one copy per host.

The trainer pushes into its host's ring (``WeightStore(backend="ring")``) as on one machine. A
``WeightServer`` actor on the trainer's host (``relay_server``) serves a version's bytes; on each generator
host, the first generator that needs a version pulls it through its ``RemoteWeightSource`` straight into a
slot of that host's own ring, and every generator on the host then reads it from there as a local store
(views, or a file for vLLM):

    server, procs = await spawn_weight_server(store)           # on the trainer's host
    source = RemoteWeightSource(server, store.name)            # picklable: give it to GeneratorService
    generator = HFGenerator(..., weight_source=source)         # on any host

- **Transport**: Monarch RDMA buffers over the sender's slot, read into the receiver's slot, where Monarch
  has an RDMA backend (ibverbs; otherwise its TCP fallback, which carries them over the actor transport
  in Monarch's runtime, not in Python); actor messages otherwise (``transport="messages"``), pickled out of the
  sender's mapping and copied once into the receiving slot.
- **One copy per host**: pulls on a host are serialised by a lock in its ring directory; the second
  generator finds the version there.
- **Versioned, resumable**: a pull is written into a ring slot under the ring's protocol, so a pull that
  dies half way leaves nothing readable; the slot records how far it got, and the next pull of that
  version resumes there (also when the server dropped the version's RDMA buffers mid-pull: the puller
  asks again). A host that was down catches up by pulling the version it is asked for (the latest),
  never the ones it missed.
- **Alongside the push**: a version still being pushed is pulled as it is written (the server follows
  the ring's watermark; the puller asks for a chunk only once it is written), and completed here only
  once the push completed and its checksum matched; a push that dies leaves this host on its previous
  version. ``wait_s``: how long a pull waits for a version that is not even being pushed yet (announced
  before the push starts).
- **Back-pressured**: at most ``window`` chunks are in flight; the next is asked for as one lands. The
  server holds the versions it serves (a shared lock on their slots), no copy of the weights.
- **Checked end to end**: the sender's checksum travels with the version; the puller sums the chunks as
  they land and completes the version only if the sums match, so its readers skip a second pass.

The source names no file of the trainer's host: generators can only reach the weights through the server.
"""


from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from forge_env.weights.errors import WeightPushGone, WeightStoreError
from forge_env.weights.relay_server import TRANSPORTS, WeightServer, rdma_backend, spawn_weight_server
from forge_env.weights.ring_format import WriterLock
from forge_env.weights.safetensors_io import DTYPES_BY_NAME
from forge_env.weights.store import WeightStore

__all__ = ["CHUNK_BYTES", "RemoteWeightSource", "WeightServer", "host_key_machine", "host_key_session",
           "spawn_weight_server"]

CHUNK_BYTES = 8 << 20
RDMA_RETRIES = 2  # fresh buffers asked for after a failed RDMA read, per pull


def host_key_machine() -> str:
    """This machine (hostname and boot id): every process on it shares one copy."""
    from forge_env.services.placement import machine_id

    return machine_id()


def host_key_session() -> str:
    """This machine and the process session: for tests, where each ``ProcessJob`` host (a worker that leads
    its own session, with everything it starts) stands for a machine of its own."""
    return f"{host_key_machine()}/{os.getsid(0)}"


class RemoteWeightSource:
    """A generator's weight source on any host: versions pulled from a ``WeightServer`` into this host's ring.

    ``transport``: ``auto`` (RDMA buffers when Monarch has a backend for them on both ends, else actor
    messages), ``rdma`` or ``messages``; ``chunk_bytes`` per buffer or message, ``window`` in flight.
    """

    def __init__(self, server: Any, name: str, *, host_key: Any = host_key_machine, root_base: str | None = None,
                 chunk_bytes: int = CHUNK_BYTES, window: int = 3, keep_versions: int = 2,
                 transport: str = "auto", wait_s: float = 0.0) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
        self.server = server
        self.name = name
        self.host_key = host_key
        self.root_base = root_base
        self.chunk_bytes = chunk_bytes
        self.window = max(1, window)
        self.keep_versions = keep_versions
        self.transport = transport
        self.wait_s = wait_s
        self.pulls = 0  # versions this process pulled (the others on its host found them in the ring)
        self.last_transport: str | None = None  # how the last pull came: "rdma" or "messages"
        self._local: WeightStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_local": None, "pulls": 0}  # the ring's mappings stay in this process

    def local_store(self) -> WeightStore:
        """This host's ring (a private directory per host key); kept, so its slots stay mapped between pulls."""
        if self._local is None:
            key = hashlib.sha256(self.host_key().encode()).hexdigest()[:12]
            root = Path(self.root_base) / f"{self.name}-{key}" if self.root_base else None
            self._local = WeightStore(f"{self.name}-recv-{key}", backend="ring", root=root,
                                      keep_versions=self.keep_versions)
        return self._local

    async def get(self, version: int) -> tuple[dict[str, Any], int]:
        store = await asyncio.to_thread(self._ensure, version)
        # No second pass over the bytes: the pull checked the sender's checksum as the chunks landed, and a
        # version is listed only once that check passed; the ring's locks exclude torn versions.
        return store.get(version, verify=False)

    def weights_path(self, version: int) -> Path | None:
        return self._ensure(version).weights_path(version)

    @contextmanager
    def hold(self, version: int) -> Iterator[Path | None]:
        with self._ensure(version).hold(version) as path:
            yield path

    def _ensure(self, version: int) -> WeightStore:
        store = self.local_store()
        if version in store.versions():
            return store
        store.backend.root.mkdir(parents=True, exist_ok=True)
        with _PullLock(store.backend.root):
            if version not in store.versions():  # another generator on this host may have pulled it meanwhile
                self._pull(store, version)
        return store

    def _pull(self, store: WeightStore, version: int) -> None:
        rdma = self.transport != "messages" and rdma_backend() != "none"
        if self.transport == "rdma" and not rdma:
            raise WeightStoreError("transport='rdma' but Monarch has no RDMA backend in this process")
        for attempt in range(RDMA_RETRIES + 1):
            desc = self.server.describe.call_one(version, self.chunk_bytes, rdma, self.wait_s).get()
            layout = tuple((name, DTYPES_BY_NAME[dtype], tuple(shape)) for name, dtype, shape in desc["layout"])
            self.last_transport = "rdma" if desc["buffers"] is not None else "messages"
            follow = _Follow(self.server, desc)
            try:
                store.backend.put_raw(layout, version, functools.partial(self._progress, desc, follow),
                                      follow.checksum if desc["live"] else desc["checksum"])
                break
            except _BufferGone:
                # The server let the version go mid-pull (it served newer ones to other hosts): describe
                # holds it again (or says it is gone) and the pull resumes where it stopped.
                if attempt == RDMA_RETRIES:
                    raise
        for old in store.versions()[: -self.keep_versions]:
            store.backend.delete(old)
        self.pulls += 1

    def _progress(self, desc: dict[str, Any], follow: _Follow, view: memoryview, start: int) -> Iterator[int]:
        """Bytes complete after each chunk lands (what the ring records for a resume)."""
        for offset, length in self._receive(desc, view, start, follow):
            yield offset + length

    def _receive(self, desc: dict[str, Any], view: memoryview, start: int,
                 follow: _Follow | None = None) -> Iterator[tuple[int, int]]:
        """Writes ``desc``'s version into ``view`` from the chunk holding ``start`` on, yielding each chunk's
        ``(offset, length)`` once it has landed, in order, with at most ``window`` in flight; each chunk is
        asked for only once ``follow`` says the sender has written it. Nothing is left writing into
        ``view`` when this ends, whether it finished, failed or was closed."""
        follow = follow or _Follow(self.server, desc)
        size, chunk, version = desc["size"], desc["chunk_bytes"], desc["version"]
        if len(view) != size:
            raise WeightStoreError(f"version {version} has {size} bytes of data but its slot here has {len(view)}")
        first = min(start, size) // chunk
        rdma = desc["buffers"] is not None
        pending: deque[tuple[int, int, Callable[[], None]]] = deque()
        try:
            for offset in range(first * chunk, size, chunk):
                length = min(chunk, size - offset)
                if not follow.has(offset + length):  # the push has not written it yet: land what is in flight,
                    while pending:  # so that what arrived is recorded (and resumable) while the push goes on
                        landed_at, landed_length, land = pending.popleft()
                        land()
                        yield landed_at, landed_length
                    follow.wait(offset + length)
                if rdma:
                    pending.append((offset, length, self._rdma_read(desc["buffers"][offset // chunk], view, offset)))
                else:
                    pending.append((offset, length, self._message_read(version, view, offset, length)))
                if len(pending) >= self.window:
                    offset, length, land = pending.popleft()
                    land()
                    yield offset, length
            while pending:
                offset, length, land = pending.popleft()
                land()
                yield offset, length
        finally:
            for _, _, land in pending if rdma else ():  # an RDMA read in flight must not land after the slot is let go
                with contextlib.suppress(Exception):
                    land()

    def _rdma_read(self, buffer: Any, view: memoryview, offset: int) -> Callable[[], None]:
        future = buffer.read_into(view[offset : offset + buffer.size()])

        def land() -> None:
            try:
                future.get()
            except Exception as e:  # noqa: BLE001 - Monarch's errors for a dropped buffer are not typed
                raise _BufferGone(f"RDMA read of the chunk at {offset} failed: {e}") from e

        return land

    def _message_read(self, version: int, view: memoryview, offset: int, length: int) -> Callable[[], None]:
        future = self.server.chunk.call_one(version, offset, length)

        def land() -> None:
            data = future.get()
            if len(data) != length:
                raise WeightStoreError(f"a chunk of version {version} at {offset} has {len(data)} bytes, not {length}")
            view[offset : offset + length] = data

        return land


class _Follow:
    """How much of a pull's version the sender has written, asked for as the pull needs it (a version being
    pushed: ``describe`` said ``live``), and its checksum once the push completed."""

    def __init__(self, server: Any, desc: dict[str, Any]) -> None:
        self.server, self.version, self.seq = server, desc["version"], desc["seq"]
        self.written, self.complete, self.sum = desc["written"], not desc["live"], desc["checksum"]

    def has(self, upto: int) -> bool:
        return self.complete or self.written >= upto

    def wait(self, upto: int) -> None:
        if not self.has(upto):
            try:
                answer = self.server.progress.call_one(self.version, self.seq, upto).get()
            except Exception as e:  # noqa: BLE001 - the server's error arrives wrapped by Monarch
                raise WeightPushGone(f"the pull of version {self.version} stopped: {e}") from e
            self.written, self.complete, self.sum = answer["written"], answer["complete"], answer["checksum"]

    def checksum(self) -> int | None:
        """The sender's checksum, once every chunk landed: waits for the push to complete."""
        self.wait(1 << 62)
        return self.sum


class _BufferGone(WeightStoreError):
    """An RDMA read failed (typically: the server dropped the version's buffers); the pull may resume."""


class _PullLock(WriterLock):
    def __init__(self, root: Path) -> None:
        self.path = root / ".pull"
