"""The layout of a ring slot and its low-level I/O (``forge_env.weights.ring``): a safetensors file whose header starts with a
fixed-width control record, and the 64-bit checksum of its data."""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forge_env.weights.safetensors_io import DTYPE_NAMES, DTYPES_BY_NAME

ALIGN = 64
RECORD = re.compile(
    rb'"forge_seq":"(\d{20})","forge_state":"([FWC])","forge_version":"(\d{20})",'
    rb'"forge_sum":"([0-9a-f]{16})","forge_summed":"([01])"'
)
SEQ_END = 33  # bytes of '"forge_seq":"' and its 20 digits: the part written first on opening, last on closing
MASK = (1 << 64) - 1
_SLOT_RE = re.compile(r"^slot-(\d+)\.safetensors$")
PREFIX = 512  # the control record sits in the first bytes of the header
# Where the 16 hex digits of ``forge_sum`` sit in the record. While a slot is being written (state ``W``)
# they hold its watermark: the bytes of data written so far, contiguous from 0, only ever growing within one
# write (``write_mark``), so a relay may send those bytes before the write completes.
MARK_AT = len(b'"forge_seq":"%020d","forge_state":"W","forge_version":"%020d","forge_sum":"' % (0, 0))


@dataclass(frozen=True)
class SlotRecord:
    index: int
    seq: int
    state: str
    version: int
    done: int = 0  # state W: bytes of a relayed version written so far (a hint; checked under the lock)


def layout_of_header(header: dict[str, Any]) -> tuple[Any, ...]:
    """The ``(name, dtype, shape)`` layout of a slot header (tensors in data order), as ``slot_header`` takes it."""
    items = sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
    return tuple((name, DTYPES_BY_NAME[spec["dtype"]], tuple(spec["shape"])) for name, spec in items)


def record_bytes(seq: int, state: str, version: int, checksum: int, summed: bool) -> bytes:
    return (b'"forge_seq":"%020d","forge_state":"%s","forge_version":"%020d","forge_sum":"%016x","forge_summed":"%d"'
            % (seq, state.encode(), version, checksum & MASK, int(summed)))


def slot_header(layout: tuple[Any, ...]) -> tuple[bytes, int, int, list[tuple[int, int]]]:
    """Header bytes, data start, file size and per-tensor offsets of a slot for ``layout``."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offsets, offset = [], 0
    for name, dtype, shape in layout:
        nbytes = torch.empty((), dtype=dtype).element_size()
        for d in shape:
            nbytes *= d
        header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offsets.append((offset, offset + nbytes))
        offset += nbytes
    # The control record first in the header, at a fixed place for the life of the slot.
    tensors = json.dumps(header, separators=(",", ":")).encode()[len(b'{"__metadata__":{"format":"pt"}') :]
    text = b'{"__metadata__":{' + record_bytes(0, "F", 0, 0, False) + b',"format":"pt"}' + tensors
    text += b" " * (-(8 + len(text)) % ALIGN)
    return text, 8 + len(text), 8 + len(text) + offset, offsets


def checksum(mm: mmap.mmap, start: int, end: int, *, parallel: bool = True) -> int:
    """A 64-bit wrapping sum of the bytes in ``[start, end)`` as int64 words (tail zero-padded).

    ``parallel``: summed by torch over its intra-op threads (the push, whose copies keep those threads
    busy anyway, and a reader's one-off verify); else by numpy on the calling thread (the relay's puller,
    which runs no other torch work: after each parallel sum torch's OpenMP workers spin waiting for more,
    which cost ~8x the CPU time of the sum itself here, 0.88 against 0.11 CPU-s per GB with 2 threads)."""
    if end <= start:
        return 0
    words = (end - start) // 8
    total = 0
    if words and parallel:
        total = int(torch.frombuffer(mm, dtype=torch.int64, count=words, offset=start).sum())
    elif words:
        total = int(np.frombuffer(mm, dtype=np.int64, count=words, offset=start).sum())
    if (end - start) % 8:
        total += int.from_bytes(bytes(mm[start + words * 8 : end]).ljust(8, b"\0"), "little", signed=True)
    return total & MASK


class RunningSum:
    """``checksum`` of a slot's data taken while it is written, range by range, each range summed right
    after it is written (still in cache) instead of in a second pass over the whole slot afterwards."""

    def __init__(self, mm: mmap.mmap, data_start: int, *, parallel: bool = True) -> None:
        self.mm, self.base, self.size = mm, data_start, len(mm) - data_start
        self.total, self.done, self.parallel = 0, 0, parallel

    def advance(self, written: int) -> None:
        """The data ``[0, written)`` is written: sum what is new of it, in whole 8-byte words."""
        end = self.size if written >= self.size else written - written % 8
        if end > self.done:
            self.total += checksum(self.mm, self.base + self.done, self.base + end, parallel=self.parallel)
            self.done = end

    def finish(self) -> int:
        self.advance(self.size)
        return self.total & MASK


def write_mark(mm: mmap.mmap, record_at: int, written: int) -> None:
    """Publish ``written`` as the watermark of the slot being written (one 16-byte store into the record,
    after the data it covers: a reader that sees the mark sees that data)."""
    mm[record_at + MARK_AT : record_at + MARK_AT + 16] = b"%016x" % (written & MASK)


def read_record(mm: mmap.mmap, record_at: int) -> tuple[int, str, int, int, bool] | None:
    """``(seq, state, version, sum or watermark, summed)`` of a slot's record, read from a mapping of it:
    read until two reads agree (a watermark grows while it is read), None if the bytes are not a record."""
    last = None
    for _ in range(100):
        found = RECORD.match(mm[record_at : record_at + 160])
        if found is None:
            return None
        now = (int(found.group(1)), found.group(2).decode(), int(found.group(3)), int(found.group(4), 16),
               found.group(5) == b"1")
        if now == last:
            return now
        last = now
    return None


def slot_indices(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _SLOT_RE.match(p.name)))


def try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def stable_record(path: Path, index: int) -> SlotRecord | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        found = RECORD.search(os.pread(fd, PREFIX, 0))
        if found is None:
            return None
        at = found.start()
        for _ in range(1000):  # seqlock: sequence, record, sequence again
            seq = int(os.pread(fd, 20, at + 13))
            record = RECORD.match(os.pread(fd, found.end() - at, at))
            if seq % 2:  # being written (or its writer died): not a readable version
                if record is None:
                    return SlotRecord(index, seq, "W", -1)
                return SlotRecord(index, seq, "W", int(record.group(3)), int(record.group(4), 16))
            if record is not None and int(record.group(1)) == seq and int(os.pread(fd, 20, at + 13)) == seq:
                return SlotRecord(index, seq, record.group(2).decode(), int(record.group(3)))
        return None
    finally:
        os.close(fd)


class WriterLock:
    """One writer at a time per ring (an exclusive lock on ``root/.writer``; released if the writer dies)."""

    def __init__(self, root: Path) -> None:
        self.path = root / ".writer"

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def set_state(path: Path, state: str) -> None:
    """Relabel a slot (``F``: dropped) under the seqlock; its data is untouched."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        prefix = os.pread(fd, PREFIX, 0)
        match = RECORD.search(prefix)
        if match is None:
            return
        seq, at = int(match.group(1)), match.start()
        _, _, version, summ, summed = match.groups()
        os.pwrite(fd, b'"forge_seq":"%020d' % (seq + 1), at)
        os.pwrite(fd, record_bytes(seq + 1, state, int(version), int(summ, 16), summed == b"1")[SEQ_END:], at + SEQ_END)
        os.pwrite(fd, b'"forge_seq":"%020d' % (seq + 2), at)
    finally:
        os.close(fd)


@dataclass
class WriterSlot:
    """A slot as the ring's writer keeps it: its locked fd, mapping, layout and tensor views of its data."""

    fd: int
    ino: int
    mm: mmap.mmap
    layout: tuple[Any, ...]
    data_start: int
    record_at: int
    views: dict[str, torch.Tensor] = field(default_factory=dict)


# A push copies (and sums) large tensors in pieces of this size, moving the watermark on after each, so a
# relay can send the start of a large tensor (an embedding) before its end is written. Smaller pieces cost
# more CPU per GB than they save in cache misses (4 MiB: ~2x the copy floor's CPU time; 32 MiB: as whole
# tensors, ~1.1x, measured on this machine's 2 cores with torch's 2 threads).
PIECE_BYTES = 32 << 20


def pieces(dst: torch.Tensor, src: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(dst, src)`` pairs covering the tensor in data order, ``PIECE_BYTES`` each where both are contiguous."""
    nbytes = dst.numel() * dst.element_size()
    if nbytes <= PIECE_BYTES or not (dst.is_contiguous() and src.is_contiguous() and src.shape == dst.shape):
        return [(dst, src)]
    step = PIECE_BYTES // dst.element_size()
    flat_dst, flat_src = dst.view(-1), src.view(-1)
    return [(flat_dst[at : at + step], flat_src[at : at + step]) for at in range(0, flat_dst.numel(), step)]
