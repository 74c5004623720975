"""Safetensors files read without copying: the format's header checked against the file, tensors mapped.

The ``WeightStore``'s shared-memory backend writes this layout; vLLM workers and generators read it (and
HF checkpoints, which use the same format) through these helpers.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import struct
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from forge_env.weights.errors import WeightsError


class SafetensorsError(WeightsError):
    """A file is not complete, valid safetensors."""


DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def safetensors_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files of ``path``: the file itself, or a directory's ``*.safetensors`` (sorted)."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise SafetensorsError(f"no safetensors weights at {path} (expected a .safetensors file or a directory of them)")
    return files


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's dtype and shape as a safetensors header lists them."""

    dtype: torch.dtype
    shape: tuple[int, ...]


def read_safetensors_specs(path: str | os.PathLike) -> dict[str, TensorSpec]:
    """Name -> dtype and shape of every tensor under ``path`` (a file or a directory), from the headers only.

    Raises ``SafetensorsError`` for a file that is not safetensors, is truncated, or holds a name twice.
    """
    specs: dict[str, TensorSpec] = {}
    for file in safetensors_files(path):
        with open(file, "rb", buffering=0) as f:
            header, _, _ = read_header(f, str(file))
        for name, spec in header.items():
            if name in specs:
                raise SafetensorsError(f"{name!r} is stored twice under {path}")
            specs[name] = TensorSpec(DTYPES_BY_NAME[spec["dtype"]], tuple(spec["shape"]))
    return specs


def map_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor under ``path`` (a safetensors file or directory), mapped from the file without copying.

    The tensors are private copy-on-write views: writable, never written back, and they keep the file's
    pages alive after it is deleted (a reader holding a version survives the store dropping it).
    """
    out: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with open(file, "rb", buffering=0) as f:
            header, _, data_start = read_header(f, str(file))
            tensors = map_tensors(f, header, data_start)
        if out.keys() & tensors.keys():
            raise SafetensorsError(f"{sorted(out.keys() & tensors.keys())[:3]} stored twice under {path}")
        out.update(tensors)
    return out


def read_header(f: Any, what: str) -> tuple[dict[str, Any], dict[str, Any], int]:
    """``(tensor specs, metadata, data start)`` of an open safetensors file, checked against its size."""
    size = os.fstat(f.fileno()).st_size
    raw = f.read(8)
    if len(raw) < 8:
        raise SafetensorsError(f"{what} is not a safetensors file (only {size} bytes)")
    (header_len,) = struct.unpack("<Q", raw)
    if header_len > size - 8:
        raise SafetensorsError(f"{what} is not a safetensors file or is truncated (header of {header_len} bytes)")
    try:
        header = json.loads(f.read(header_len))
    except ValueError as exc:
        raise SafetensorsError(f"{what}: unreadable safetensors header ({exc})") from None
    meta = header.pop("__metadata__", None) or {}
    data_start = 8 + header_len
    for name, spec in header.items():
        if spec.get("dtype") not in DTYPES_BY_NAME:
            raise SafetensorsError(f"{what}: tensor {name!r} has unsupported dtype {spec.get('dtype')!r}")
        begin, end = spec["data_offsets"]
        expected = element_size(DTYPES_BY_NAME[spec["dtype"]]) * _numel(spec["shape"])
        if not 0 <= begin <= end or end - begin != expected:
            raise SafetensorsError(f"{what}: tensor {name!r} has offsets {spec['data_offsets']} for shape {spec['shape']}")
        if data_start + end > size:
            raise SafetensorsError(f"{what} is truncated: tensor {name!r} ends past the end of the file")
    return header, meta, data_start


def map_tensors(f: Any, header: Mapping[str, Any], data_start: int) -> dict[str, torch.Tensor]:
    # A shared lock on the file, which the mapping keeps (it duplicates the descriptor) until its last
    # tensor is gone: a ring slot (forge_env.weights.ring) is never rewritten under a reader that holds it.
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    except OSError:  # a file system without locks (some FUSE mounts): checkpoints there are never rewritten
        pass
    # A private (copy-on-write) mapping: writable for torch, no copy unless written to.
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if os.fstat(f.fileno()).st_size else None
    out: dict[str, torch.Tensor] = {}
    tensor_views(mm, header, data_start, out)
    return out


def tensor_views(buffer: Any, header: Mapping[str, Any], data_start: int,
                 out: MutableMapping[str, torch.Tensor]) -> None:
    """Put into ``out`` a tensor viewing ``buffer`` for each entry of a (checked) safetensors ``header``."""
    for name, spec in header.items():
        dtype = DTYPES_BY_NAME[spec["dtype"]]
        begin, end = spec["data_offsets"]
        if end == begin:
            out[name] = torch.empty(spec["shape"], dtype=dtype)
            continue
        count = (end - begin) // element_size(dtype)
        out[name] = torch.frombuffer(buffer, dtype=dtype, count=count, offset=data_start + begin).view(spec["shape"])


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
