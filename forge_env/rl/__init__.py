"""RL core: training samples, advantages, losses, replay buffer, trainers, reference model.

The weight hand-off to generators (``WeightStore``) lives in ``forge_env.weights``; ``WeightStore`` and
its errors are importable from here too.

Building blocks only (the loops that drive them live in ``agents``). Names are
imported lazily so ``import forge_env.rl`` stays cheap; torch loads on first use of a
tensor-side name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "TrainSample": "forge_env.rl.types",
    "InvalidSampleError": "forge_env.rl.types",
    "MessageLevelTrajectoryError": "forge_env.rl.types",
    "AdvantageResult": "forge_env.rl.advantages",
    "compute_advantages": "forge_env.rl.advantages",
    "group_advantages": "forge_env.rl.advantages",
    "ReplayBuffer": "forge_env.rl.buffer",
    "ReplayBufferConfig": "forge_env.rl.buffer",
    "ReplayBufferActor": "forge_env.rl.buffer_actor",
    "LossOutput": "forge_env.rl.losses",
    "LOSSES": "forge_env.rl.losses",
    "get_loss": "forge_env.rl.losses",
    "grpo_loss": "forge_env.rl.losses",
    "ppo_clip_loss": "forge_env.rl.losses",
    "dapo_loss": "forge_env.rl.losses",
    "gspo_loss": "forge_env.rl.losses",
    "cispo_loss": "forge_env.rl.losses",
    "reinforce_loss": "forge_env.rl.losses",
    "sft_loss": "forge_env.rl.losses",
    "OffPolicyConfig": "forge_env.rl.off_policy",
    "with_off_policy_correction": "forge_env.rl.off_policy",
    "TorchTrainer": "forge_env.rl.trainer",
    "TrainerConfig": "forge_env.rl.trainer",
    "ReferenceModel": "forge_env.rl.reference",
    "TrainerActor": "forge_env.rl.trainer_actor",
    "ReferenceActor": "forge_env.rl.trainer_actor",
    "TitanTrainer": "forge_env.rl.titan",
    "TitanTrainerConfig": "forge_env.rl.titan_config",
    "Trainer": "forge_env.rl.protocols",
    # The weight hand-off lives in forge_env.weights; these names stay importable from here.
    "WeightStore": "forge_env.weights.store",
    "WeightStoreError": "forge_env.weights.errors",
    "WeightVersionNotFound": "forge_env.weights.errors",
}

__all__ = [
    "AdvantageResult",
    "InvalidSampleError",
    "MessageLevelTrajectoryError",
    "LOSSES",
    "LossOutput",
    "OffPolicyConfig",
    "ReferenceActor",
    "ReferenceModel",
    "ReplayBuffer",
    "ReplayBufferActor",
    "ReplayBufferConfig",
    "TitanTrainer",
    "TitanTrainerConfig",
    "TorchTrainer",
    "TrainSample",
    "Trainer",
    "TrainerActor",
    "TrainerConfig",
    "WeightStore",
    "WeightStoreError",
    "WeightVersionNotFound",
    "cispo_loss",
    "compute_advantages",
    "dapo_loss",
    "get_loss",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "ppo_clip_loss",
    "reinforce_loss",
    "sft_loss",
    "with_off_policy_correction",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge_env.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from forge_env.rl.advantages import AdvantageResult, compute_advantages, group_advantages
    from forge_env.rl.buffer import ReplayBuffer, ReplayBufferConfig
    from forge_env.rl.buffer_actor import ReplayBufferActor
    from forge_env.rl.losses import (
        LOSSES,
        LossOutput,
        cispo_loss,
        dapo_loss,
        get_loss,
        grpo_loss,
        gspo_loss,
        ppo_clip_loss,
        reinforce_loss,
        sft_loss,
    )
    from forge_env.rl.off_policy import OffPolicyConfig, with_off_policy_correction
    from forge_env.rl.protocols import Trainer
    from forge_env.rl.reference import ReferenceModel
    from forge_env.rl.titan import TitanTrainer, TitanTrainerConfig
    from forge_env.rl.trainer import TorchTrainer, TrainerConfig
    from forge_env.rl.trainer_actor import ReferenceActor, TrainerActor
    from forge_env.rl.types import InvalidSampleError, TrainSample
    from forge_env.weights.errors import WeightStoreError, WeightVersionNotFound
    from forge_env.weights.store import WeightStore
