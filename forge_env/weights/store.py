"""Versioned hand-off of model weights from the trainer to generators.

The trainer ``put``s a state dict under a policy version; generators ``get`` a version
(or the latest) and load it. Only the newest ``keep_versions`` versions are kept.

Backends:

- ``"shm"`` (default): one file per version under ``/dev/shm`` in the safetensors layout,
  written with a plain memory copy and read back by ``mmap`` without copying. No service
  to run; every process on the host that knows the store's ``root`` can read it, and a
  ``WeightStore`` pickles to just its settings, so it can be passed to Monarch actors.
- ``"torchstore"``: Meta's torchstore on Monarch (RDMA across hosts), only where a
  torchstore compatible with the installed Monarch is importable; call
  ``await torchstore.initialize(store_name=...)`` once before using it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from forge_env.generation.base import can_adopt_weights, retie_embeddings
from forge_env.rl.safetensors_io import (
    DTYPE_NAMES,
    DTYPES_BY_NAME,
    SafetensorsError,
    map_tensors,
    read_header,
)

_FILE_RE = re.compile(r"^v(\d+)\.safetensors$")
_ALIGN = 64


class WeightStoreError(RuntimeError):
    """The weight store cannot do what was asked (missing version, unusable backend, bad data)."""


class WeightVersionNotFound(WeightStoreError, LookupError):
    """The requested version is not in the store (never pushed, or already dropped)."""


@dataclass(frozen=True)
class WeightsInfo:
    """What a ``put`` stored."""

    version: int
    num_tensors: int
    num_bytes: int


class StoredWeights(dict):
    """A stored version's tensors as copy-on-write views of shared memory that nothing else writes.

    A generator may adopt them as its parameters instead of copying them (``immutable_views``):
    the hand-off then costs the trainer's one write, and the generator's pull is only a mapping.
    """

    immutable_views = True


class WeightBackend(Protocol):
    """Where the bytes live; ``WeightStore`` adds versioning on top."""

    def put(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightsInfo: ...
    def get(self, version: int) -> dict[str, torch.Tensor]: ...
    def versions(self) -> list[int]: ...
    def delete(self, version: int) -> None: ...
    def clear(self) -> None: ...


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


class TorchStoreBackend:
    """Weights in torchstore (``put_state_dict``/``get_state_dict``), keyed ``<name>/v<version>``."""

    def __init__(self, name: str, store_name: str | None = None) -> None:
        self.name = name
        self.store_name = store_name
        self._ts = _import_torchstore()

    def __reduce__(self) -> tuple[Any, ...]:
        return (TorchStoreBackend, (self.name, self.store_name))

    def _kw(self) -> dict[str, Any]:
        return {} if self.store_name is None else {"store_name": self.store_name}

    def _key(self, version: int) -> str:
        return f"{self.name}/v{version:012d}"

    def put(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightsInfo:
        from forge_env.utils.aio import run_sync

        run_sync(self._ts.put_state_dict(dict(state_dict), self._key(version), **self._kw()))
        nbytes = sum(t.numel() * t.element_size() for t in state_dict.values())
        return WeightsInfo(version=version, num_tensors=len(state_dict), num_bytes=nbytes)

    def get(self, version: int) -> dict[str, torch.Tensor]:
        from forge_env.utils.aio import run_sync

        if version not in self.versions():
            raise WeightVersionNotFound(f"weights version {version} is not in torchstore under {self.name!r}")
        return run_sync(self._ts.get_state_dict(self._key(version), **self._kw()))

    def versions(self) -> list[int]:
        from forge_env.utils.aio import run_sync

        keys = run_sync(self._ts.keys(f"{self.name}/v", **self._kw()))
        found = {int(m.group(1)) for k in keys if (m := re.match(rf"^{re.escape(self.name)}/v(\d+)/MAPPING$", k))}
        return sorted(found)

    def delete(self, version: int) -> None:
        from forge_env.utils.aio import run_sync

        prefix = self._key(version)
        for key in run_sync(self._ts.keys(prefix, **self._kw())):
            run_sync(self._ts.delete(key, **self._kw()))

    def clear(self) -> None:
        for version in self.versions():
            self.delete(version)


def _import_torchstore() -> Any:
    try:
        import torchstore

        for attr in ("put_state_dict", "get_state_dict", "keys", "delete"):
            if not hasattr(torchstore, attr):
                raise ImportError(f"torchstore has no {attr}()")
    except Exception as exc:  # an incompatible torchstore fails at import in many ways
        raise WeightStoreError(
            f"the torchstore backend needs a torchstore compatible with the installed Monarch ({exc!r}); "
            "torchstore 0.1.2 on PyPI pins Monarch 0.1.2. Use backend='shm' (the default) instead."
        ) from exc
    return torchstore


class WeightStore:
    """Versioned weights between one trainer and many generators.

    ``put(state_dict, version)`` stores a version and drops all but the newest
    ``keep_versions``; ``get(version=None)`` returns ``(state_dict, version)`` for that
    version or the latest one. Tensors from the shm backend are read-only views of shared
    memory unless ``copy=True``; ``load_into(model)`` copies them straight into a model.
    """

    def __init__(
        self,
        name: str = "default",
        *,
        backend: Literal["shm", "torchstore"] | WeightBackend = "shm",
        root: str | os.PathLike | None = None,
        keep_versions: int = 2,
    ) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be >= 1 (the latest version is always kept)")
        self.name = name
        self.keep_versions = keep_versions
        if backend == "shm":
            self.backend: WeightBackend = SharedMemoryBackend(root if root is not None else default_shm_root(name))
        elif backend == "torchstore":
            self.backend = TorchStoreBackend(name)
        elif isinstance(backend, str):
            raise ValueError(f"unknown weight store backend {backend!r}; choose 'shm' or 'torchstore'")
        else:
            self.backend = backend

    def put(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightsInfo:
        """Store ``state_dict`` as ``version`` (replacing that version if present) and drop old versions."""
        if version < 0:
            raise ValueError(f"weight versions are non-negative integers, got {version}")
        if not state_dict:
            raise WeightStoreError("refusing to store an empty state dict")
        info = self.backend.put(state_dict, version)
        for old in self.backend.versions()[: -self.keep_versions]:
            self.backend.delete(old)
        return info

    def get(self, version: int | None = None, *, copy: bool = False) -> tuple[dict[str, torch.Tensor], int]:
        """``(state_dict, version)`` for ``version``, or for the latest version when it is None."""
        if version is None:
            state, version = self._get_latest()
        else:
            state = self.backend.get(version)
        if copy:
            state = {k: v.clone() for k, v in state.items()}
        return state, version

    def load(self, version: int) -> dict[str, torch.Tensor]:
        """The state dict of ``version`` (a generator's ``weight_source``: ``HFGenerator(..., weight_source=store.load)``)."""
        return self.get(version)[0]

    def load_shared(self, model: torch.nn.Module, version: int | None = None, *, strict: bool = True) -> int:
        """Make ``model``'s CPU parameters the stored version's shared-memory views, without copying; returns it.

        For a model that only runs inference (a generator): its parameters become copy-on-write
        mappings of the store's file, so the pull costs a mapping, not a copy. Tied weights are
        tied again afterwards. Falls back to :meth:`load_into` (a copy) where views cannot be
        used: another backend, or parameters not on the CPU or of another dtype.
        """
        state, version = self.get(version)
        if not can_adopt_weights(model, state):
            return self.load_into(model, version, strict=strict)
        model.load_state_dict(state, strict=strict, assign=True)
        retie_embeddings(model)
        return version

    def weights_path(self, version: int) -> Path | None:
        """The safetensors file holding ``version`` (shm backend), for readers that map it themselves
        (vLLM workers); ``None`` on backends without files. Raises ``WeightVersionNotFound`` if absent."""
        if not isinstance(self.backend, SharedMemoryBackend):
            return None
        path = self.backend.path(version)
        if not path.is_file():
            raise WeightVersionNotFound(
                f"weights version {version} is not in {self.backend.root} (have {self.versions()})"
            )
        return path

    def load_into(self, model: torch.nn.Module, version: int | None = None, *, strict: bool = True) -> int:
        """Copy a stored version (default: the latest) into ``model``'s parameters in place; returns it.

        On the shm backend this reads straight into the parameters' memory (the fastest pull).
        """
        if version is None:
            version = self.latest_version()
            if version is None:
                raise WeightVersionNotFound(f"weight store {self.name!r} is empty; the trainer has not pushed yet")
        targets = model.state_dict(keep_vars=True)
        if isinstance(self.backend, SharedMemoryBackend):
            self.backend.read_into(version, {k: v.data for k, v in targets.items()}, strict=strict)
        else:
            state, version = self.get(version)
            model.load_state_dict(state, strict=strict)
        return version

    def _get_latest(self) -> tuple[dict[str, torch.Tensor], int]:
        for _ in range(3):  # a push may drop the version we just listed before we open it
            version = self.latest_version()
            if version is None:
                raise WeightVersionNotFound(f"weight store {self.name!r} is empty; the trainer has not pushed yet")
            try:
                return self.backend.get(version), version
            except WeightVersionNotFound:
                continue
        raise WeightStoreError(f"weight store {self.name!r}: versions kept disappearing while reading the latest")

    def latest_version(self) -> int | None:
        versions = self.backend.versions()
        return versions[-1] if versions else None

    def versions(self) -> list[int]:
        return self.backend.versions()

    def clear(self) -> None:
        """Remove every stored version (and the shm directory)."""
        self.backend.clear()

    def __repr__(self) -> str:
        return f"WeightStore(name={self.name!r}, backend={type(self.backend).__name__}, keep_versions={self.keep_versions})"
