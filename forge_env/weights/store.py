"""Versioned hand-off of model weights from the trainer to generators.

The trainer ``put``s a state dict under a policy version; generators ``get`` a version
(or the latest) and load it. Only the newest ``keep_versions`` versions are kept.

Backends:

- ``"shm"`` (default): one file per version under ``/dev/shm`` in the safetensors layout,
  written with a plain memory copy and read back by ``mmap`` without copying. No service
  to run; every process on the host that knows the store's ``root`` can read it, and a
  ``WeightStore`` pickles to just its settings, so it can be passed to Monarch actors.
- ``"ring"``: a few pre-faulted shared-memory slots under ``/dev/shm`` reused across versions
  (``forge_env.weights.ring``): a push is one memory copy into pages that already exist, a pull one
  mapping; readers hold a slot (a shared lock) while they hold its tensors, so it is never overwritten
  under them. The fast local path; each version's file is still in the safetensors layout.

Across hosts the relay carries versions (``forge_env.weights.relay``). There is no ``torchstore`` backend:
torchstore 0.1.2 on PyPI pins torchmonarch 0.1.2 and torch 2.9 and cannot run with this project's Monarch,
so ``backend="torchstore"`` raises ``WeightStoreError`` saying so (:data:`UNSUPPORTED_BACKENDS`).

The store is a weight source for generators (``get(version)``) and names its files
(``weights_path(version)``, see ``forge_env.weights.source``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch

from forge_env.weights.adopt import can_adopt_weights, retie_embeddings
from forge_env.weights.backend import WeightBackend, WeightsInfo
from forge_env.weights.errors import WeightStoreError, WeightVersionNotFound
from forge_env.weights.ring import RingBackend
from forge_env.weights.shm import SharedMemoryBackend, default_shm_root


def _shm(name: str, root: str | os.PathLike | None, **_: object) -> WeightBackend:
    return SharedMemoryBackend(root if root is not None else default_shm_root(name))


def _ring(name: str, root: str | os.PathLike | None, *, keep_versions: int, checksum: bool, max_slots: int,
          **_: object) -> WeightBackend:
    root = root if root is not None else default_shm_root(name)
    return RingBackend(root, checksum=checksum, max_slots=max(max_slots, keep_versions + 1))


#: ``WeightStore(backend=NAME)`` -> ``factory(name, root, keep_versions=, checksum=, max_slots=)``, building
#: the ``WeightBackend`` (a backend may ignore the settings it has no use for).
WEIGHT_BACKENDS: dict[str, Callable[..., WeightBackend]] = {"shm": _shm, "ring": _ring}

#: Backends asked for by name that this project does not support, and why (``WeightStoreError``).
UNSUPPORTED_BACKENDS: dict[str, str] = {
    "torchstore": ("torchstore is not supported: torchstore 0.1.2 on PyPI pins torchmonarch 0.1.2 and torch 2.9 "
                   "and cannot run with this project's Monarch. Use backend='ring' or 'shm' on one host; across "
                   "hosts the trainer's versions reach generators through the relay (generator.weight_transport="
                   "monarch, forge_env.weights.relay)"),
}


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
        backend: Literal["shm", "ring"] | WeightBackend = "shm",
        root: str | os.PathLike | None = None,
        keep_versions: int = 2,
        checksum: bool = True,
        max_slots: int = 8,
    ) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be >= 1 (the latest version is always kept)")
        self.name = name
        self.keep_versions = keep_versions
        if isinstance(backend, str):
            if backend in UNSUPPORTED_BACKENDS:
                raise WeightStoreError(UNSUPPORTED_BACKENDS[backend])
            try:
                make = WEIGHT_BACKENDS[backend]
            except KeyError:
                raise ValueError(f"unknown weight store backend {backend!r}; choose one of "
                                 f"{', '.join(map(repr, WEIGHT_BACKENDS))}") from None
            self.backend: WeightBackend = make(name, root, keep_versions=keep_versions, checksum=checksum,
                                               max_slots=max_slots)
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

    def get(
        self, version: int | None = None, *, copy: bool = False, verify: bool | None = None
    ) -> tuple[dict[str, torch.Tensor], int]:
        """``(state_dict, version)`` for ``version``, or for the latest version when it is None.

        ``verify`` (ring backend): check the version's checksum (None: when the push took one; False:
        skip the pass over the bytes, the ring's lock protocol already excludes torn versions).
        """
        if version is None:
            state, version = self._get_latest(verify)
        else:
            state = self._backend_get(version, verify)
        if copy:
            state = {k: v.clone() for k, v in state.items()}
        return state, version

    def load(self, version: int) -> dict[str, torch.Tensor]:
        """The state dict of ``version``: a plain callable weight source. Pass the store itself as a
        generator's ``weight_source`` to let it also read the store's files (``weights_path``)."""
        return self.get(version)[0]

    def load_shared(self, model: torch.nn.Module, version: int | None = None, *, strict: bool = True,
                    verify: bool | None = None) -> int:
        """Make ``model``'s CPU parameters the stored version's shared-memory views, without copying; returns it.

        For a model that only runs inference (a generator): its parameters become copy-on-write
        mappings of the store's file, so the pull costs a mapping, not a copy. Tied weights are
        tied again afterwards. Falls back to :meth:`load_into` (a copy) where views cannot be
        used: another backend, or parameters not on the CPU or of another dtype. ``verify`` as in ``get``.
        """
        state, version = self.get(version, verify=verify)
        if not can_adopt_weights(model, state):
            return self.load_into(model, version, strict=strict)
        model.load_state_dict(state, strict=strict, assign=True)
        retie_embeddings(model)
        return version

    def weights_path(self, version: int) -> Path | None:
        """The safetensors file holding ``version`` (shm backend), for readers that map it themselves
        (vLLM workers): the store is a ``WeightFileSource``. ``None`` on backends without files.
        Raises ``WeightVersionNotFound`` if absent."""
        if isinstance(self.backend, RingBackend):
            path, fd = self.backend.hold(version)
            os.close(fd)
            return path
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
        if isinstance(self.backend, SharedMemoryBackend | RingBackend):
            self.backend.read_into(version, {k: v.data for k, v in targets.items()}, strict=strict)
        else:
            state, version = self.get(version)
            model.load_state_dict(state, strict=strict)
        return version

    def _backend_get(self, version: int, verify: bool | None) -> dict[str, torch.Tensor]:
        if isinstance(self.backend, RingBackend):
            return self.backend.get(version, verify=verify)
        return self.backend.get(version)

    @contextmanager
    def hold(self, version: int) -> Iterator[Path | None]:
        """The file of ``version`` (as ``weights_path``), kept from being overwritten until the block ends.

        Ring slots are reused, so a reader that maps the file itself (a vLLM worker) must read it inside
        this block; on the ``shm`` backend files are never rewritten and this is ``weights_path``.
        """
        if not isinstance(self.backend, RingBackend):
            yield self.weights_path(version)
            return
        path, fd = self.backend.hold(version)
        try:
            yield path
        finally:
            os.close(fd)

    def _get_latest(self, verify: bool | None = None) -> tuple[dict[str, torch.Tensor], int]:
        for _ in range(3):  # a push may drop the version we just listed before we open it
            version = self.latest_version()
            if version is None:
                raise WeightVersionNotFound(f"weight store {self.name!r} is empty; the trainer has not pushed yet")
            try:
                return self._backend_get(version, verify), version
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
