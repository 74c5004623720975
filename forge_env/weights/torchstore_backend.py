"""The torchstore backend: Meta's torchstore on Monarch (RDMA across hosts).

Usable only where a torchstore compatible with the installed Monarch is importable; call
``await torchstore.initialize(store_name=...)`` once before using it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from forge_env.weights.backend import WeightsInfo
from forge_env.weights.errors import WeightStoreError, WeightVersionNotFound


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
