"""The trainer's side of the relay (``forge_env.weights.relay``): an actor serving a ring's versions.

``WeightServer`` holds the versions it serves (a shared lock on their slots, so the trainer never rewrites
them mid-pull) and sends their bytes straight out of the ring's pages: as Monarch RDMA buffers over the
slot's memory where the platform has a backend for them (ibverbs, or Monarch's TCP fallback), or as actor
messages whose payload is pickled out of the mapping without an intermediate copy. Its mappings of the
slots are kept (pre-faulted) across versions, as the ring's writer keeps its own, so serving a version
costs no page faults; they share the ring's pages, so there is no extra copy of the weights in memory.

A version still being pushed is served as it is written: ``describe`` finds its slot marked writing (state
``W``, its writer holding the slot's lock) and ``progress`` tells the puller how far the write got (the
watermark the ring's push moves on after each piece it copies), so a pull runs alongside the push instead of
after it. The write is told apart from any other by its odd sequence number; the version's checksum goes to
the puller only once that very write completed (the slot then ``C`` with the next, even number), and the
server then takes its shared lock as for a complete version. A writer that dies, or a slot taken over for
another write, ends the pull with an error: the puller's copy of the version is never completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import mmap
import os
import pickle
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from monarch.actor import Actor, endpoint

from forge_env.weights.errors import WeightStoreError, WeightVersionNotFound
from forge_env.weights.ring import RingBackend
from forge_env.weights.ring_format import PREFIX, RECORD, layout_of_header, read_record, try_lock
from forge_env.weights.safetensors_io import DTYPE_NAMES
from forge_env.weights.store import WeightStore

TRANSPORTS = ("auto", "rdma", "messages")
POLL_S = 0.001  # how often a version being written is looked at again


def rdma_backend() -> str:
    """Monarch's RDMA backend in this process: ``ibverbs``, ``tcp`` (its fallback over the actor
    transport) or ``none``."""
    try:
        from monarch.rdma import get_rdma_backend

        return get_rdma_backend()
    except Exception:  # noqa: BLE001 - no native bindings on this platform
        return "none"


@dataclass
class _Held:
    """A version the server holds: the locked fd (the hold), the slot's mapping and its data region."""

    version: int
    fd: int
    mm: mmap.mmap
    data_start: int
    header: dict[str, Any]
    record_at: int
    seq: int  # the slot's sequence number: odd while ``live`` (the write followed), even once complete
    checksum: int | None  # once complete (None: pushed without one)
    live: bool = False  # being written: ``fd`` holds no lock until the write completes
    buffers: dict[int, list[Any]] = field(default_factory=dict)  # chunk size -> RDMA buffers over the data

    @property
    def size(self) -> int:
        return len(self.mm) - self.data_start


class WeightServer(Actor):
    """Serves the versions of a ring ``WeightStore`` on its host, holding the ``hold`` it served last."""

    def __init__(self, store: WeightStore, hold: int = 2, transport: str = "auto") -> None:
        if not isinstance(store.backend, RingBackend):
            raise WeightStoreError(f"a WeightServer serves a ring store (backend='ring'), not {store.backend!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        self.store = store
        self.hold = max(1, hold)
        self.transport = transport
        self._held: OrderedDict[int, _Held] = OrderedDict()  # least recently served first
        self._maps: dict[int, mmap.mmap] = {}  # slot file inode -> its read-only, pre-faulted mapping

    async def _version(self, version: int, wait_s: float = 0.0) -> _Held:
        """``version``, complete (held) or being written (followed), waiting up to ``wait_s`` for it to appear."""
        held = self._held.get(version)
        if held is not None:
            self._held.move_to_end(version)
            return held
        deadline, pause = time.monotonic() + wait_s, POLL_S
        while (held := self._complete(version) or self._being_written(version)) is None:
            if time.monotonic() >= deadline:
                raise WeightVersionNotFound(
                    f"weights version {version} is neither in {self.store.backend.root} (have "
                    f"{self.store.versions()}) nor being written there; it was never pushed or was dropped as too old")
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 3 * POLL_S)  # each look lists the ring: back off a little while nothing comes
        self._held[version] = held
        while len(self._held) > self.hold:
            await self._release(self._held.popitem(last=False)[1])
        return held

    def _opened(self, version: int, fd: int, live: bool) -> _Held | None:
        """A ``_Held`` for the slot behind ``fd`` (closed if it does not hold ``version`` as expected)."""
        try:
            mm = self._mapping(fd)
            header_len = int.from_bytes(mm[:8], "little")
            found = RECORD.search(mm[8 : 8 + PREFIX])
            record = read_record(mm, 8 + found.start()) if found else None
        except BaseException:
            os.close(fd)
            raise
        if record is None or record[1] != ("W" if live else "C") or record[2] != version:
            os.close(fd)
            return None
        seq, _, _, total, summed = record
        return _Held(version, fd, mm, 8 + header_len, json.loads(mm[8 : 8 + header_len]), 8 + found.start(), seq,
                     None if live or not summed else total, live)

    def _complete(self, version: int) -> _Held | None:
        try:
            _, fd = self.store.backend.hold(version)  # a shared lock on its slot, on this fd
        except WeightVersionNotFound:
            return None
        return self._opened(version, fd, live=False)

    def _being_written(self, version: int) -> _Held | None:
        """The slot a live writer is writing ``version`` into (its exclusive lock held), followed unlocked."""
        for record in self.store.backend.records():
            if record.state != "W" or record.version != version:
                continue
            try:
                fd = os.open(self.store.backend.slot_path(record.index), os.O_RDONLY)
            except FileNotFoundError:
                continue
            if try_lock(fd, fcntl.LOCK_SH):  # no writer: it completed meanwhile, or it died
                os.close(fd)
                continue
            held = self._opened(version, fd, live=True)
            if held is not None:
                return held
        return None

    def _mapping(self, fd: int) -> mmap.mmap:
        """The slot behind ``fd`` mapped through a file description of its own (so the mapping does not
        carry the lock), kept while the slot file exists."""
        ino = os.fstat(fd).st_ino
        if ino not in self._maps:
            own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # the same file, even if its path was replaced
            try:
                self._maps[ino] = mmap.mmap(own, 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                            prot=mmap.PROT_READ)
            finally:
                os.close(own)
            self._prune_maps()
        return self._maps[ino]

    def _prune_maps(self) -> None:
        """Unmap slot files the ring replaced (their pages go once no one maps them)."""
        live = set()
        for path in self.store.backend.root.glob("slot-*.safetensors"):
            with contextlib.suppress(FileNotFoundError):
                live.add(path.stat().st_ino)
        live |= {os.fstat(h.fd).st_ino for h in self._held.values()}
        for ino in [i for i in self._maps if i not in live]:
            mm = self._maps.pop(ino)
            with contextlib.suppress(BufferError):  # a buffer still exported: the GC unmaps it later
                mm.close()

    async def _release(self, held: _Held) -> None:
        """Drop the version's RDMA buffers (a puller still reading them gets an error and asks again),
        then its lock: the trainer may rewrite the slot only once no buffer reads it."""
        for buffers in held.buffers.values():
            for buffer in buffers:
                with contextlib.suppress(Exception):
                    await buffer.drop()
        held.buffers.clear()
        os.close(held.fd)

    def _rdma_buffers(self, held: _Held, chunk_bytes: int) -> list[Any] | None:
        if self.transport == "messages" or rdma_backend() == "none":
            if self.transport == "rdma":
                raise WeightStoreError("transport='rdma' but Monarch has no RDMA backend in this process")
            return None
        if chunk_bytes not in held.buffers:
            from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning

            data = memoryview(held.mm)[held.data_start :]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RDMATcpFallbackWarning)  # chosen knowingly: said in the docs
                held.buffers[chunk_bytes] = [RDMABuffer(data[at : at + chunk_bytes])
                                             for at in range(0, len(data), chunk_bytes)]
        return held.buffers[chunk_bytes]

    async def _follow(self, held: _Held, upto: int) -> int:
        """Bytes of ``held`` written (at least ``upto``, or all once complete), waiting for the writer; its
        write gone (the writer died, or the slot was taken for another write) raises."""
        while held.live:
            record = read_record(held.mm, held.record_at)
            if record is not None and record[:3] == (held.seq, "W", held.version) and record[3] >= upto:
                return min(record[3], held.size)
            if try_lock(held.fd, fcntl.LOCK_SH):  # the writer let go: completed, or died
                record = read_record(held.mm, held.record_at)
                if record is not None and record[:3] == (held.seq + 1, "C", held.version):
                    held.seq, held.live = record[0], False  # held now, as a complete version is
                    held.checksum = record[3] if record[4] else None
                    break
                self._held.pop(held.version, None)
                await self._release(held)
                written = record[3] if record is not None and record[0] == held.seq else "?"
                raise WeightStoreError(
                    f"the push of version {held.version} stopped after {written} of {held.size} bytes (its writer "
                    "died, or its slot was taken for another write): this pull of it cannot complete")
            await asyncio.sleep(POLL_S)
        return held.size

    @endpoint
    async def describe(self, version: int | None, chunk_bytes: int = 8 << 20, rdma: bool = False,
                       wait_s: float = 0.0) -> dict[str, Any]:
        """``version`` (None: the latest complete one): its layout, data size, and, when ``rdma`` and this
        process has an RDMA backend, RDMA buffers over its data in ``chunk_bytes`` pieces; its checksum if
        it is complete, else (``live``) how much of it is written so far and the write's ``seq`` to follow
        with ``progress``. Waits up to ``wait_s`` for a version not yet pushed."""
        if version is None:
            version = self.store.latest_version()
            if version is None:
                raise WeightVersionNotFound(f"weight store {self.store.name!r} is empty")
        held = await self._version(version, wait_s)
        layout = [(name, DTYPE_NAMES[dtype], list(shape)) for name, dtype, shape in layout_of_header(held.header)]
        buffers = self._rdma_buffers(held, chunk_bytes) if rdma and held.size else None
        written = await self._follow(held, 0)
        return {"version": version, "layout": layout, "size": held.size, "buffers": buffers,
                "chunk_bytes": chunk_bytes, "live": held.live, "seq": held.seq, "written": written,
                "checksum": None if held.live else held.checksum}

    @endpoint
    async def progress(self, version: int, seq: int, upto: int) -> dict[str, Any]:
        """How far the write of ``version`` numbered ``seq`` (from ``describe``) got, once it got to ``upto``
        bytes: ``written``, and ``complete`` with its ``checksum`` once it is complete."""
        held = await self._version(version)
        if held.seq not in (seq, seq + 1):
            raise WeightStoreError(f"version {version} was written again since this pull of it started")
        written = await self._follow(held, upto)
        return {"written": written, "complete": not held.live, "checksum": None if held.live else held.checksum}

    @endpoint
    async def chunk(self, version: int, offset: int, length: int) -> pickle.PickleBuffer:
        """Bytes ``[offset, offset + length)`` of ``version``'s data, pickled straight out of the slot."""
        held = await self._version(version)
        await self._follow(held, offset + length)  # a version being written: once these bytes are
        start = held.data_start + offset
        return pickle.PickleBuffer(memoryview(held.mm)[start : start + length])


    @endpoint
    async def cpu_seconds(self) -> float:
        """CPU time of this server's process so far (what serving costs, for benchmarks)."""
        return time.process_time()


async def spawn_weight_server(store: WeightStore, *, name: str = "weight_server", hold: int = 2,
                              transport: str = "auto") -> tuple[Any, Any]:
    """``(server, procs)``: a ``WeightServer`` for ``store`` in its own process on this host; ``await
    procs.stop()`` ends it."""
    from monarch.actor import this_host

    procs = this_host().spawn_procs(per_host={"procs": 1})
    return procs.spawn(name, WeightServer, store, hold, transport), procs
