"""RL core: training samples, advantages, losses, replay buffer, trainers, reference model.

The weight hand-off to generators (``WeightStore``) lives in ``forge_env.weights``; ``WeightStore`` is
importable from here too.

Building blocks only (the loops that drive them live in ``agents``). This package exports what a training
script needs; the rest stays importable from its module (losses from :mod:`forge_env.rl.losses`, the
torchtitan trainer from :mod:`forge_env.rl.titan`, the Monarch actors from :mod:`forge_env.rl.trainer_actor`, ...).
Names are imported lazily so ``import forge_env.rl`` stays cheap; torch loads on first use of a
tensor-side name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "TrainSample": "forge_env.rl.types",
    "MessageLevelTrajectoryError": "forge_env.rl.types",
    "compute_advantages": "forge_env.rl.advantages",
    "ReplayBuffer": "forge_env.rl.buffer",
    "ReplayBufferConfig": "forge_env.rl.buffer",
    "ReplayBufferActor": "forge_env.rl.buffer_actor",
    "TorchTrainer": "forge_env.rl.trainer",
    "TrainerConfig": "forge_env.rl.trainer",
    "ReferenceModel": "forge_env.rl.reference",
    "Trainer": "forge_env.rl.protocols",
    "WeightStore": "forge_env.weights.store",
}

__all__ = [
    "MessageLevelTrajectoryError",
    "ReferenceModel",
    "ReplayBuffer",
    "ReplayBufferActor",
    "ReplayBufferConfig",
    "TorchTrainer",
    "TrainSample",
    "Trainer",
    "TrainerConfig",
    "WeightStore",
    "compute_advantages",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge_env.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from forge_env.rl.advantages import compute_advantages
    from forge_env.rl.buffer import ReplayBuffer, ReplayBufferConfig
    from forge_env.rl.buffer_actor import ReplayBufferActor
    from forge_env.rl.protocols import Trainer
    from forge_env.rl.reference import ReferenceModel
    from forge_env.rl.trainer import TorchTrainer, TrainerConfig
    from forge_env.rl.types import MessageLevelTrajectoryError, TrainSample
    from forge_env.weights.store import WeightStore
