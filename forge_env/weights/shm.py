"""The shared-memory backend: one safetensors-layout file per version under ``/dev/shm``.

Written with a plain memory copy and read back by ``mmap`` without copying. No service to run; every
process on the host that knows the store's ``root`` can read it, and the backend pickles to its root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from forge_env.weights.backend import StoredWeights, WeightsInfo
from forge_env.weights.errors import WeightStoreError, WeightVersionNotFound
from forge_env.weights.safetensors_io import (
    DTYPE_NAMES,
    DTYPES_BY_NAME,
    SafetensorsError,
    map_tensors,
    read_header,
)

_FILE_RE = re.compile(r"^v(\d+)\.safetensors$")
_ALIGN = 64


def default_shm_root(name: str) -> Path:
    """``/dev/shm/forge_env_weights/<name>`` (or the temp dir where /dev/shm does not exist)."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    return base / "forge_env_weights" / name


class SharedMemoryBackend:
    """One safetensors-layout file per version in a shared-memory directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def __reduce__(self) -> tuple[Any, ...]:
        return (SharedMemoryBackend, (str(self.root),))

    def path(self, version: int) -> Path:
        return self.root / f"v{version:012d}.safetensors"

    def put(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightsInfo:
        self.root.mkdir(parents=True, exist_ok=True)
        # Largest elements first keeps every tensor aligned to its element size without holes.
        items = sorted(state_dict.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
        header: dict[str, Any] = {"__metadata__": {"format": "pt", "version": str(version)}}
        offset = 0
        for name, tensor in items:
            if tensor.dtype not in DTYPE_NAMES:
                raise WeightStoreError(f"tensor {name!r} has dtype {tensor.dtype}, which the shm store cannot hold")
            nbytes = tensor.numel() * tensor.element_size()
            header[name] = {"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        header_bytes = json.dumps(header, separators=(",", ":")).encode()
        header_bytes += b" " * (-(8 + len(header_bytes)) % _ALIGN)

        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
        try:
            # write() lets tmpfs allocate pages in the kernel, about twice as fast as faulting
            # them in through a writable mapping.
            with os.fdopen(fd, "wb", buffering=0) as f:
                fd = -1
                f.write(struct.pack("<Q", len(header_bytes)) + header_bytes)
                for _, tensor in items:
                    if tensor.numel():
                        f.write(_as_bytes(tensor))
            # Readers only ever see complete files, and a published file is never written again:
            # generators that adopted its pages as parameters (load_shared) rely on that.
            os.replace(tmp, self.path(version))
        finally:
            if fd >= 0:
                os.close(fd)
            if os.path.exists(tmp):
                os.unlink(tmp)
        return WeightsInfo(version=version, num_tensors=len(items), num_bytes=offset)

    def _open(self, version: int):
        try:
            return open(self.path(version), "rb", buffering=0)
        except FileNotFoundError:
            raise WeightVersionNotFound(
                f"weights version {version} is not in {self.root} (have {self.versions()}); "
                "it was never pushed or was dropped as too old"
            ) from None

    def _header(self, f: Any, version: int) -> tuple[dict[str, Any], int]:
        try:
            header, meta, data_start = read_header(f, str(self.path(version)))
        except SafetensorsError as exc:
            raise WeightStoreError(str(exc)) from exc
        if meta.get("version") != str(version):
            raise WeightStoreError(f"{self.path(version)} holds version {meta.get('version')!r}, expected {version}")
        return header, data_start

    def get(self, version: int) -> StoredWeights:
        with self._open(version) as f:
            header, data_start = self._header(f, version)
            # Copy-on-write views of the file; never MAP_POPULATE (on a writable private mapping the
            # kernel populates by breaking COW, i.e. by copying).
            return StoredWeights(map_tensors(f, header, data_start))

    def read_into(self, version: int, targets: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
        """Fill ``targets`` (e.g. a model's state dict) with ``version`` in place.

        Contiguous CPU tensors of the stored dtype and shape are filled by ``preadv`` straight
        into their memory: one kernel copy, no page faults, no temporary.
        """
        with self._open(version) as f:
            header, data_start = self._header(f, version)
            if strict and set(header) != set(targets):
                missing, unexpected = sorted(set(targets) - set(header)), sorted(set(header) - set(targets))
                raise WeightStoreError(f"version {version} does not match: missing {missing}, unexpected {unexpected}")
            for name, target in targets.items():
                spec = header.get(name)
                if spec is None:
                    continue
                if list(target.shape) != spec["shape"]:
                    raise WeightStoreError(f"{name}: stored shape {spec['shape']} != target shape {list(target.shape)}")
                begin, end = spec["data_offsets"]
                direct = (
                    target.device.type == "cpu"
                    and target.is_contiguous()
                    and DTYPE_NAMES.get(target.dtype) == spec["dtype"]
                )
                buf = target if direct else torch.empty(spec["shape"], dtype=DTYPES_BY_NAME[spec["dtype"]])
                if end > begin:
                    _pread_exact(f.fileno(), buf, data_start + begin, f"{self.path(version)}:{name}")
                if not direct:
                    with torch.no_grad():
                        target.copy_(buf)

    def versions(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _FILE_RE.match(p.name)))

    def delete(self, version: int) -> None:
        # Readers that already mapped the file keep their pages until they drop the tensors.
        self.path(version).unlink(missing_ok=True)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return memoryview(raw.cpu().numpy())


def _pread_exact(fd: int, tensor: torch.Tensor, offset: int, what: str) -> None:
    view = memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())
    done = 0
    while done < len(view):  # Linux returns at most ~2 GiB per read
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise WeightStoreError(f"{what} is truncated")
        done += n
