"""Weights across hosts without a shared file system: chunks over Monarch actor messages.

The trainer pushes into its host's ring (``WeightStore(backend="ring")``) as on one machine. A
``WeightServer`` actor on the trainer's host serves a version's bytes in chunks; on each generator host,
the first generator that needs a version pulls it through its ``RemoteWeightSource`` into that host's own
ring, and every generator on the host then reads it from there as a local store (views, or a file for vLLM):

    server, procs = await spawn_weight_server(store)           # on the trainer's host
    source = RemoteWeightSource(server, store.name)            # picklable: give it to GeneratorService
    generator = HFGenerator(..., weight_source=source)         # on any host

- **One copy per host**: pulls on a host are serialised by a lock in its ring directory; the second
  generator finds the version there.
- **Versioned, resumable**: a pull is written into a ring slot under the ring's protocol, so a pull that
  dies half way leaves nothing readable; the slot records how far it got, and the next pull of that
  version resumes there. A host that was down catches up by pulling the version it is asked for (the
  latest), never the ones it missed.
- **Back-pressured**: the puller asks for the next chunk (at most ``window`` in flight) only as it writes
  them; the server holds the versions it serves (a shared lock on their slots), no copy of the weights.
- **Checked end to end**: the sender's checksum travels with the version and is verified when read.

The source names no file of the trainer's host: generators can only reach the weights through the server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from monarch.actor import Actor, endpoint

from forge_env.weights.errors import WeightVersionNotFound
from forge_env.weights.ring_format import WriterLock, layout_of_header
from forge_env.weights.safetensors_io import DTYPE_NAMES, DTYPES_BY_NAME
from forge_env.weights.store import WeightStore

CHUNK_BYTES = 8 << 20


class WeightServer(Actor):
    """Serves the versions of a ring ``WeightStore`` on its host in chunks (holding the ones it serves)."""

    def __init__(self, store: WeightStore, hold: int = 2) -> None:
        self.store = store
        self.hold = hold
        self._open: dict[int, tuple[Any, int]] = {}  # version -> (read-only mapping, data start)

    def _version(self, version: int) -> tuple[Any, int]:
        if version not in self._open:
            mm, _ = self.store.backend.open_raw(version)
            self._open[version] = (mm, 8 + int.from_bytes(mm[:8], "little"))
            for old in sorted(self._open)[: -self.hold]:
                self._open.pop(old)[0].close()
        return self._open[version]

    @endpoint
    async def describe(self, version: int | None) -> dict[str, Any]:
        """``version`` (None: the latest): its layout, data size and checksum."""
        if version is None:
            version = self.store.latest_version()
            if version is None:
                raise WeightVersionNotFound(f"weight store {self.store.name!r} is empty")
        mm, data_start = self._version(version)
        header = json.loads(mm[8:data_start])
        meta = header["__metadata__"]
        layout = [(name, DTYPE_NAMES[dtype], list(shape)) for name, dtype, shape in layout_of_header(header)]
        return {"version": version, "layout": layout, "size": len(mm) - data_start,
                "checksum": int(meta["forge_sum"], 16) if meta["forge_summed"] == "1" else None}

    @endpoint
    async def chunk(self, version: int, offset: int, length: int) -> bytes:
        mm, data_start = self._version(version)
        return mm[data_start + offset : data_start + offset + length]


async def spawn_weight_server(store: WeightStore, *, name: str = "weight_server") -> tuple[Any, Any]:
    """``(server, procs)``: a ``WeightServer`` for ``store`` in its own process on this host; ``await
    procs.stop()`` ends it."""
    from monarch.actor import this_host

    procs = this_host().spawn_procs(per_host={"procs": 1})
    return procs.spawn(name, WeightServer, store), procs


def host_key_machine() -> str:
    """This machine (hostname and boot id): every process on it shares one copy."""
    from forge_env.services.placement import machine_id

    return machine_id()


def host_key_session() -> str:
    """This machine and the process session: for tests, where each ``ProcessJob`` host (a worker that leads
    its own session, with everything it starts) stands for a machine of its own."""
    return f"{host_key_machine()}/{os.getsid(0)}"


class RemoteWeightSource:
    """A generator's weight source on any host: versions pulled from a ``WeightServer`` into this host's ring."""

    def __init__(self, server: Any, name: str, *, host_key: Any = host_key_machine, root_base: str | None = None,
                 chunk_bytes: int = CHUNK_BYTES, window: int = 2, keep_versions: int = 2) -> None:
        self.server = server
        self.name = name
        self.host_key = host_key
        self.root_base = root_base
        self.chunk_bytes = chunk_bytes
        self.window = max(1, window)
        self.keep_versions = keep_versions
        self.pulls = 0  # versions this process pulled (the others on its host found them in the ring)
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
        return store.get(version)

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
        desc = self.server.describe.call_one(version).get()
        layout = tuple((name, DTYPES_BY_NAME[dtype], tuple(shape)) for name, dtype, shape in desc["layout"])
        store.backend.put_raw(layout, version, lambda start: self._chunks(version, desc["size"], start),
                              desc["checksum"])
        for old in store.versions()[: -self.keep_versions]:
            store.backend.delete(old)
        self.pulls += 1

    def _chunks(self, version: int, size: int, start: int = 0) -> Iterator[tuple[int, bytes]]:
        offsets = list(range(start, size, self.chunk_bytes))
        pending: list[tuple[int, Any]] = []
        for offset in offsets:
            pending.append((offset, self.server.chunk.call_one(version, offset, min(self.chunk_bytes, size - offset))))
            if len(pending) >= self.window:
                at, future = pending.pop(0)
                yield at, future.get()
        for at, future in pending:
            yield at, future.get()


class _PullLock(WriterLock):
    def __init__(self, root: Path) -> None:
        self.path = root / ".pull"
