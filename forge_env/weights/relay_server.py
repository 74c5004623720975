"""The trainer's side of the relay (``forge_env.weights.relay``): an actor serving a ring's versions.

``WeightServer`` holds the versions it serves (a shared lock on their slots, so the trainer never rewrites
them mid-pull) and sends their bytes straight out of the ring's pages: as Monarch RDMA buffers over the
slot's memory where the platform has a backend for them (ibverbs, or Monarch's TCP fallback), or as actor
messages whose payload is pickled out of the mapping without an intermediate copy. Its mappings of the
slots are kept (pre-faulted) across versions, as the ring's writer keeps its own, so serving a version
costs no page faults; they share the ring's pages, so there is no extra copy of the weights in memory.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import pickle
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from monarch.actor import Actor, endpoint

from forge_env.weights.errors import WeightStoreError, WeightVersionNotFound
from forge_env.weights.ring import RingBackend
from forge_env.weights.ring_format import layout_of_header
from forge_env.weights.safetensors_io import DTYPE_NAMES
from forge_env.weights.store import WeightStore

TRANSPORTS = ("auto", "rdma", "messages")


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
    buffers: dict[int, list[Any]] = field(default_factory=dict)  # chunk size -> RDMA buffers over the data


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

    async def _version(self, version: int) -> _Held:
        held = self._held.get(version)
        if held is not None:
            self._held.move_to_end(version)
            return held
        _, fd = self.store.backend.hold(version)  # a shared lock on its slot, on this fd
        try:
            mm = self._mapping(fd)
        except BaseException:
            os.close(fd)
            raise
        header_len = int.from_bytes(mm[:8], "little")
        held = _Held(version, fd, mm, 8 + header_len, json.loads(mm[8 : 8 + header_len]))
        self._held[version] = held
        while len(self._held) > self.hold:
            await self._release(self._held.popitem(last=False)[1])
        return held

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

    @endpoint
    async def describe(self, version: int | None, chunk_bytes: int = 8 << 20, rdma: bool = False) -> dict[str, Any]:
        """``version`` (None: the latest): its layout, data size, checksum and, when ``rdma`` and this
        process has an RDMA backend, RDMA buffers over its data in ``chunk_bytes`` pieces."""
        if version is None:
            version = self.store.latest_version()
            if version is None:
                raise WeightVersionNotFound(f"weight store {self.store.name!r} is empty")
        held = await self._version(version)
        meta = held.header["__metadata__"]
        layout = [(name, DTYPE_NAMES[dtype], list(shape)) for name, dtype, shape in layout_of_header(held.header)]
        size = len(held.mm) - held.data_start
        buffers = self._rdma_buffers(held, chunk_bytes) if rdma and size else None
        return {"version": version, "layout": layout, "size": size, "buffers": buffers, "chunk_bytes": chunk_bytes,
                "checksum": int(meta["forge_sum"], 16) if meta["forge_summed"] == "1" else None}

    @endpoint
    async def chunk(self, version: int, offset: int, length: int) -> pickle.PickleBuffer:
        """Bytes ``[offset, offset + length)`` of ``version``'s data, pickled straight out of the slot."""
        held = await self._version(version)
        start = held.data_start + offset
        return pickle.PickleBuffer(memoryview(held.mm)[start : start + length])


async def spawn_weight_server(store: WeightStore, *, name: str = "weight_server", hold: int = 2,
                              transport: str = "auto") -> tuple[Any, Any]:
    """``(server, procs)``: a ``WeightServer`` for ``store`` in its own process on this host; ``await
    procs.stop()`` ends it."""
    from monarch.actor import this_host

    procs = this_host().spawn_procs(per_host={"procs": 1})
    return procs.spawn(name, WeightServer, store, hold, transport), procs
