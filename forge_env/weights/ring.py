"""The ring backend: a few pre-faulted shared-memory slots reused across versions (the local fast path).

Each slot is a file in the safetensors layout under ``/dev/shm`` whose header carries a control record
(``forge_seq``, ``forge_state``, ``forge_version``, ``forge_sum``) at a fixed place. The writer keeps every
slot mapped (pages allocated and faulted once), so a push is one memory copy into pages that already exist;
readers take a version as copy-on-write views of its slot, so a pull is one mapping.

Protocol (no version is ever seen half-written):

- A **writer** takes an exclusive ``flock`` on a slot, marks it writing (``forge_seq`` odd, state ``W``),
  copies the tensors in, writes the version and optional checksum, marks it complete (state ``C``,
  ``forge_seq`` even) and unlocks. It never writes the newest complete version's slot, nor a slot any reader
  holds: when every other slot is held it adds a slot (up to ``max_slots``).
- A **reader** takes a shared ``flock`` on the slot (non-blocking: a slot being written is skipped), checks
  that it is complete and holds the version, and maps it. The lock lives on the open file that the mapping
  duplicates, so it is held exactly as long as any tensor view of the version lives, and the kernel drops
  it when the reader dies. Listing versions takes no lock: it reads ``forge_seq`` before and after the
  record (a seqlock) and retries on a change.
- A writer killed mid-write leaves its slot marked ``W`` (readers skip it; the next push reuses it); the
  kernel releases its lock; the previous versions stay readable. A reader killed mid-read releases its lock.

The checksum (a 64-bit sum of the data, taken in the push's copy pass unless ``checksum=False``) is checked on
``get(verify=True)``; the lock protocol alone already excludes torn versions, so callers may skip it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from forge_env.weights.backend import StoredWeights, WeightsInfo
from forge_env.weights.errors import WeightPushGone, WeightStoreError, WeightVersionNotFound
from forge_env.weights.ring_format import (
    MASK,
    PREFIX,
    RECORD,
    SEQ_END,
    RunningSum,
    SlotRecord,
    WriterLock,
    layout_of_header,
    record_bytes,
    set_state,
    slot_header,
    slot_indices,
    stable_record,
    try_lock,
    write_mark,
)
from forge_env.weights.ring_format import (
    WriterSlot as _WriterSlot,
)
from forge_env.weights.ring_format import checksum as checksum_of
from forge_env.weights.ring_format import (
    pieces as _pieces,
)
from forge_env.weights.safetensors_io import DTYPE_NAMES, tensor_views

_MADV_POPULATE_READ = 22
class RingBackend:
    """Versions in ``max_slots`` (at most) reusable shared-memory slots; see the module docstring."""

    def __init__(self, root: str | os.PathLike, *, checksum: bool = True, max_slots: int = 8) -> None:
        if max_slots < 2:
            raise ValueError("a ring needs max_slots >= 2 (one to read while the next is written)")
        self.root = Path(root)
        self.checksum = checksum
        self.max_slots = max_slots
        self._slots: dict[int, _WriterSlot] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (str(self.root), self.checksum, self.max_slots))

    def slot_path(self, index: int) -> Path:
        return self.root / f"slot-{index}.safetensors"

    # ------------------------------------------------------------------ writer

    def put(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightsInfo:
        self.root.mkdir(parents=True, exist_ok=True)
        items = sorted(state_dict.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
        for name, tensor in items:
            if tensor.dtype not in DTYPE_NAMES:
                raise WeightStoreError(f"tensor {name!r} has dtype {tensor.dtype}, which the shm store cannot hold")
        layout = tuple((name, t.dtype, tuple(t.shape)) for name, t in items)

        def fill(slot: _WriterSlot, start: int) -> int | None:
            running = RunningSum(slot.mm, slot.data_start) if self.checksum else None
            written = 0
            with torch.no_grad():
                for name, tensor in items:
                    if not tensor.numel():
                        continue
                    for dst, src in _pieces(slot.views[name], tensor.detach()):  # the mark moves on after each
                        dst.copy_(src)
                        written += dst.numel() * dst.element_size()
                        if running is not None:
                            running.advance(written)
                        write_mark(slot.mm, slot.record_at, written)
            return running.finish() if running is not None else None

        self._write(layout, version, fill)
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        return WeightsInfo(version=version, num_tensors=len(items), num_bytes=nbytes)

    def put_raw(self, layout: tuple[Any, ...], version: int, receive: Any, checksum: int | None) -> None:
        """Store ``version`` from raw data written straight into a slot (a relay from another host's ring).

        ``receive(view, start)`` writes the data region's bytes from ``start`` on into ``view`` (a writable
        memoryview of the slot's data region, whose offsets are the sender's: ``layout`` is the sender's,
        ``ring_format.layout_of_header``), yielding the number of bytes complete (contiguous from 0) after
        each chunk lands. That progress is recorded in the slot, so a pull of the same version after this
        one died resumes where it stopped. ``checksum`` is the sender's (``None``: none taken): the bytes are
        summed as each chunk lands (while it is still in cache) and the version is completed only if the
        sum matches, so a reader may skip its own pass (``get(verify=False)``); it is kept in the slot, so
        ``get(verify=True)`` checks the bytes end to end again. ``checksum`` may be a function giving it
        once every chunk landed (the sender's version was being written when the pull started); ``receive``
        raising ``WeightPushGone`` (that write will not complete) drops the progress: the next pull starts over.
        """
        def fill(slot: _WriterSlot, start: int) -> int | None:
            view = memoryview(slot.mm)[slot.data_start :]
            # From 0 (a resumed pull sums the earlier part too), on this thread (see ``checksum``).
            running = RunningSum(slot.mm, slot.data_start, parallel=False)
            try:
                for done in receive(view, start):
                    write_mark(slot.mm, slot.record_at, done)
                    if checksum is not None:
                        running.advance(done)
            except WeightPushGone:
                write_mark(slot.mm, slot.record_at, 0)  # what landed came from a write that is gone
                raise
            finally:
                with contextlib.suppress(BufferError):  # a slice still referenced elsewhere: left to the GC
                    view.release()
            final = checksum() if callable(checksum) else checksum
            if final is not None and running.finish() != final & MASK:
                write_mark(slot.mm, slot.record_at, 0)  # the next pull starts over
                raise WeightStoreError(f"version {version} arrived with checksum {running.finish():016x}, "
                                       f"not the sender's {final & MASK:016x}")
            return final

        self.root.mkdir(parents=True, exist_ok=True)
        self._write(layout, version, fill, resume=True)

    def _write(self, layout: tuple[Any, ...], version: int, fill: Any, resume: bool = False) -> None:
        with WriterLock(self.root):
            slot, start = self._resume_slot(layout, version) if resume else (None, 0)
            slot = slot or self._acquire_slot(layout)
            try:
                seq = self._seq(slot)
                # Odd: being written. A new write gets a new odd number (also over a dead writer's), so a
                # relay serving this write as it happens can tell it from any other; a resumed one keeps it.
                seq = (seq if start else seq + 2) if seq % 2 else seq + 1
                self._write_record(slot, seq, "W", version, start, False)
                taken = fill(slot, start)  # the checksum, when fill took it as it wrote
                summed = taken is not None or self.checksum
                total = taken if taken is not None else (
                    checksum_of(slot.mm, slot.data_start, len(slot.mm)) if self.checksum else 0)
                # The same version pushed again: the older copy stops being listed once this one is complete.
                stale = [r.index for r in self.records() if r.version == version and r.state == "C"]
                self._write_record(slot, seq + 1, "C", version, total, summed)
                for index in stale:
                    if index != self._index_of(slot):
                        set_state(self.slot_path(index), "F")
            finally:
                fcntl.flock(slot.fd, fcntl.LOCK_UN)

    def _index_of(self, slot: _WriterSlot) -> int:
        return next(i for i, s in self._slots.items() if s is slot)

    def _resume_slot(self, layout: tuple[Any, ...], version: int) -> tuple[_WriterSlot | None, int]:
        """A slot that a pull of ``version`` which died left part-written, and how far it got."""
        for record in self.records():
            if record.state != "W" or record.version != version or record.done <= 0:
                continue
            slot = self._slots.get(record.index)
            if slot is None or slot.ino != self.slot_path(record.index).stat().st_ino:
                slot = self._map_existing(record.index, layout)
            elif not try_lock(slot.fd, fcntl.LOCK_EX):
                slot = None
            if slot is None:
                continue
            found = RECORD.match(bytes(slot.mm[slot.record_at : slot.record_at + 160]))
            if slot.layout == layout and found and found.group(2) == b"W" and int(found.group(3)) == version:
                return slot, int(found.group(4), 16)
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
        return None, 0

    def _map_existing(self, index: int, layout: tuple[Any, ...]) -> _WriterSlot | None:
        """Slot ``index`` as it is on disk, locked for writing, when its layout is ``layout``."""
        fd = os.open(self.slot_path(index), os.O_RDWR)
        header_len = int.from_bytes(os.pread(fd, 8, 0), "little")
        if not try_lock(fd, fcntl.LOCK_EX) or layout_of_header(json.loads(os.pread(fd, header_len, 8))) != layout:
            os.close(fd)
            return None
        mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        header_bytes = mm[8 : 8 + header_len]
        return self._keep_slot(index, fd, mm, layout, header_bytes, slot_header(layout)[3])

    def _acquire_slot(self, layout: tuple[Any, ...]) -> _WriterSlot:
        records = self.records()
        complete = [r for r in records if r.state == "C"]
        newest = max(complete, key=lambda r: r.version).index if complete else None
        # Free and abandoned (W) slots first, then the oldest complete versions; never the newest.
        order = sorted((r for r in records if r.index != newest), key=lambda r: (r.state == "C", r.version))
        for record in order:
            slot = self._writer_slot(record.index, layout)
            if slot is not None:
                return slot
        existing = {r.index for r in records} | set(slot_indices(self.root))
        index = next(i for i in range(len(existing) + 1) if i not in existing)
        if index >= self.max_slots:
            raise WeightStoreError(
                f"all {len(existing)} weight slots under {self.root} are held by readers or hold the newest version; "
                f"readers keep a slot while they hold its tensors (raise max_slots={self.max_slots} or drop old views)"
            )
        return self._create_slot(index, layout)

    def _writer_slot(self, index: int, layout: tuple[Any, ...]) -> _WriterSlot | None:
        """The slot at ``index`` locked exclusively for writing, or None while a reader holds it."""
        path = self.slot_path(index)
        slot = self._slots.get(index)
        try:
            ino = path.stat().st_ino
        except FileNotFoundError:
            return None
        if slot is None or slot.ino != ino:  # written by another process (or replaced): map a fresh one
            fd = os.open(path, os.O_RDONLY)
            try:
                if not try_lock(fd, fcntl.LOCK_SH):  # someone writes or reads it: leave it alone
                    return None
            finally:
                os.close(fd)
            return self._create_slot(index, layout)
        if not try_lock(slot.fd, fcntl.LOCK_EX):
            return None
        if slot.layout != layout:  # another model shape: rebuild the slot (readers keep the old file's pages)
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
            return self._create_slot(index, layout)
        return slot

    def _create_slot(self, index: int, layout: tuple[Any, ...]) -> _WriterSlot:
        header_bytes, data_start, size, offsets = slot_header(layout)
        tmp = self.root / f".slot-{index}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, len(header_bytes).to_bytes(8, "little") + header_bytes)
            os.posix_fallocate(fd, 0, size)  # allocate every page now, not on each push
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            os.replace(tmp, self.slot_path(index))
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return self._keep_slot(index, fd, mm, layout, header_bytes, offsets)

    def _keep_slot(self, index: int, fd: int, mm: mmap.mmap, layout: tuple[Any, ...], header_bytes: bytes,
                   offsets: list[tuple[int, int]]) -> _WriterSlot:
        data_start = 8 + len(header_bytes)
        record_at = 8 + RECORD.search(header_bytes).start()
        views = {}
        for (name, dtype, shape), (begin, end) in zip(layout, offsets, strict=True):
            if end > begin:
                count = (end - begin) // torch.empty((), dtype=dtype).element_size()
                views[name] = torch.frombuffer(mm, dtype=dtype, count=count, offset=data_start + begin).view(shape)
        self._forget(index)
        slot = _WriterSlot(fd, os.fstat(fd).st_ino, mm, layout, data_start, record_at, views)
        self._slots[index] = slot
        return slot

    def _forget(self, index: int) -> None:
        old = self._slots.pop(index, None)
        if old is not None:
            old.views.clear()
            os.close(old.fd)  # the mapping is left to the garbage collector (views may still point into it)

    def _seq(self, slot: _WriterSlot) -> int:
        match = RECORD.match(bytes(slot.mm[slot.record_at : slot.record_at + 160]))
        return int(match.group(1))

    def _write_record(self, slot: _WriterSlot, seq: int, state: str, version: int, checksum: int, summed: bool) -> None:
        at = slot.record_at
        record = record_bytes(seq, state, version, checksum, summed)
        if seq % 2:  # opening: the odd sequence first, then the rest
            slot.mm[at : at + SEQ_END] = record[:SEQ_END]
            slot.mm[at + SEQ_END : at + len(record)] = record[SEQ_END:]
        else:  # closing: the record first, then the even sequence
            slot.mm[at + SEQ_END : at + len(record)] = record[SEQ_END:]
            slot.mm[at : at + SEQ_END] = record[:SEQ_END]

    # ------------------------------------------------------------------ readers

    def records(self) -> list[SlotRecord]:
        """Every slot's control record, read without locks (seqlock: retried while a writer changes it)."""
        out = []
        for index in slot_indices(self.root):
            record = stable_record(self.slot_path(index), index)
            if record is not None:
                out.append(record)
        return out

    def versions(self) -> list[int]:
        return sorted({r.version for r in self.records() if r.state == "C"})

    def get(self, version: int, *, verify: bool | None = None) -> StoredWeights:
        """``version`` as copy-on-write views of its slot, which stays locked while any view lives."""
        for record in self.records():
            if record.state != "C" or record.version != version:
                continue
            weights = self._map(record.index, version, verify)
            if weights is not None:
                return weights
        raise WeightVersionNotFound(
            f"weights version {version} is not in {self.root} (have {self.versions()}); "
            "it was never pushed or was dropped as too old"
        )

    def hold(self, version: int) -> tuple[Path, int]:
        """``(slot path, fd)``: a shared lock on the slot holding ``version``; close the fd to release it."""
        for record in self.records():
            if record.state == "C" and record.version == version:
                fd = self._lock_reading(record.index, version)
                if fd is not None:
                    return self.slot_path(record.index), fd
        raise WeightVersionNotFound(f"weights version {version} is not in {self.root} (have {self.versions()})")

    def _lock_reading(self, index: int, version: int) -> int | None:
        try:
            fd = os.open(self.slot_path(index), os.O_RDONLY)
        except FileNotFoundError:
            return None
        if try_lock(fd, fcntl.LOCK_SH):
            match = RECORD.search(os.pread(fd, PREFIX, 0))
            if match and match.group(2) == b"C" and int(match.group(3)) == version and int(match.group(1)) % 2 == 0:
                return fd
        os.close(fd)
        return None

    def _map(self, index: int, version: int, verify: bool | None) -> StoredWeights | None:
        fd = self._lock_reading(index, version)
        if fd is None:
            return None
        try:
            # The mapping duplicates fd, and with it the lock: held until the last view is gone.
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        header_len = int.from_bytes(mm[:8], "little")
        header = json.loads(mm[8 : 8 + header_len])
        meta = header.pop("__metadata__")
        data_start = 8 + header_len
        if verify or (verify is None and meta.get("forge_summed") == "1"):
            if meta.get("forge_summed") != "1":
                raise WeightStoreError(f"version {version} was pushed without a checksum (checksum=False)")
            if checksum_of(mm, data_start, len(mm)) != int(meta["forge_sum"], 16):
                raise WeightStoreError(f"version {version} in {self.slot_path(index)} fails its checksum")
        try:
            mm.madvise(_MADV_POPULATE_READ, data_start, len(mm) - data_start)  # map all pages in one call
        except (OSError, ValueError):
            pass
        out = StoredWeights()
        tensor_views(mm, header, data_start, out)
        return out

    def read_into(self, version: int, targets: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
        stored = self.get(version)
        if strict and set(stored) != set(targets):
            missing, unexpected = sorted(set(targets) - set(stored)), sorted(set(stored) - set(targets))
            raise WeightStoreError(f"version {version} does not match: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for name, target in targets.items():
                if name in stored:
                    if tuple(target.shape) != tuple(stored[name].shape):
                        raise WeightStoreError(
                            f"{name}: stored shape {list(stored[name].shape)} != target shape {list(target.shape)}")
                    target.copy_(stored[name])

    def delete(self, version: int) -> None:
        for record in self.records():
            if record.state == "C" and record.version == version:
                set_state(self.slot_path(record.index), "F")

    def clear(self) -> None:
        for index in list(self._slots):
            self._forget(index)
        shutil.rmtree(self.root, ignore_errors=True)


def _rebuild(root: str, checksum: bool, max_slots: int) -> RingBackend:
    return RingBackend(root, checksum=checksum, max_slots=max_slots)
