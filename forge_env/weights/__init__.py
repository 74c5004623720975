"""The weight hand-off from trainers to generators, in one place.

    store = WeightStore("run-7")                  # trainer side: put(state_dict, version)
    trainer = TorchTrainer(model, weight_store=store)
    generator = HFGenerator(model, tokenizer, weight_source=store)   # generator side: get / weights_path

Modules (``forge_env.rl`` and ``forge_env.generation`` both import this package; it imports neither):

- ``source``: the ``WeightSource`` contract (what a generator's ``weight_source`` may be),
  ``fetch_weights``, and ``WeightFileSource``/``weights_file`` for sources that name their files.
- ``store``: ``WeightStore``, versioned weights over a backend; ``backend``: the ``WeightBackend``
  protocol; ``shm`` and ``ring`` (reused pre-faulted slots, the fast local path): the backends.
- ``relay`` / ``relay_server``: ``RemoteWeightSource`` / ``WeightServer``, versions to generators on other
  hosts over Monarch (RDMA buffers, or actor messages), one copy per host (imports Monarch; not
  re-exported here).
- ``safetensors_io``: safetensors headers checked and tensors mapped without copying.
- ``specs``: ``ModelWeightSpecs``, an update checked against a model's parameters before loading.
- ``adapter``: ``LoRAConfig`` and ``AdapterWeightSpecs``, a LoRA adapter as a weight update (PEFT names).
- ``adopt``: ``can_adopt_weights`` / ``retie_embeddings``, stored tensors taken as parameters.
- ``errors``: ``WeightsError`` and its subclasses.

The package exports what wiring a trainer to generators needs (the store, the ``WeightSource`` contract, the
errors, the shm backend and the ``WeightBackend`` protocol); the rest stays importable from its module. The
contract and errors import without torch; the rest loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forge_env.weights.errors import (
    WeightMismatchError,
    WeightPushGone,
    WeightsError,
    WeightSourceError,
    WeightStoreError,
    WeightVersionNotFound,
)
from forge_env.weights.source import (
    WeightFileSource,
    WeightSource,
    fetch_weights,
    held_weights_file,
    weights_file,
)

_LAZY: dict[str, str] = {
    "WeightStore": "forge_env.weights.store",
    "WeightBackend": "forge_env.weights.backend",
    "WeightsInfo": "forge_env.weights.backend",
    "SharedMemoryBackend": "forge_env.weights.shm",
}

__all__ = [
    "SharedMemoryBackend",
    "WeightBackend",
    "WeightFileSource",
    "WeightMismatchError",
    "WeightPushGone",
    "WeightSource",
    "WeightSourceError",
    "WeightStore",
    "WeightStoreError",
    "WeightVersionNotFound",
    "WeightsError",
    "WeightsInfo",
    "fetch_weights",
    "held_weights_file",
    "weights_file",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forge_env.weights' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from forge_env.weights.backend import WeightBackend, WeightsInfo
    from forge_env.weights.shm import SharedMemoryBackend
    from forge_env.weights.store import WeightStore
