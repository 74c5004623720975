"""The ``Trainer`` protocol: what the training loops need from a trainer (``TorchTrainer``, ``TitanTrainer``).

A trainer owns the policy's trainable weights: ``train_step`` takes one optimizer step on a batch,
``logprobs`` scores a batch under the current policy, ``push_weights(version)`` publishes the weights
to generators through its ``weight_store`` and makes ``version`` its ``policy_version``, and
``save``/``load`` checkpoint everything needed to resume (model, optimizer, schedule, ``step``, RNG).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from forge_env.rl.types import TrainSample

if TYPE_CHECKING:
    import torch

    from forge_env.weights.backend import WeightsInfo
    from forge_env.weights.store import WeightStore

#: A flat batch of samples, or groups of them (trainers flatten it).
Batch = Sequence[TrainSample] | Sequence[Sequence[TrainSample]]


@runtime_checkable
class Trainer(Protocol):
    """A policy trainer (see the module docstring)."""

    model: Any
    """The trained module (a transformers model for ``TorchTrainer``, torchtitan's for ``TitanTrainer``)."""
    step: int
    """Optimizer steps taken (restored by ``load``)."""
    weight_store: WeightStore | None
    """Where ``push_weights`` publishes; ``None`` means it cannot push."""
    policy_version: int
    """The version last published by ``push_weights`` (0 before the first push)."""


    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics (loss, grad_norm, lr, step, ...)."""
        ...

    def logprobs(self, batch: Batch) -> list[list[float]]:
        """The current policy's logprob of every token of every sample (0.0 for token 0)."""
        ...

    def state_dict_for_generators(self, *, full: bool = False) -> dict[str, torch.Tensor]:
        """The weights generators load, under transformers names (with LoRA: the adapter's tensors alone, or
        with ``full`` the base weights)."""
        ...

    def push_weights(self, version: int, *, full: bool = False) -> WeightsInfo | None:
        """Publish the current weights as ``version`` (``None`` on ranks that do not write); ``full``: as
        :meth:`state_dict_for_generators` says."""
        ...

    def save(self, path: str | os.PathLike) -> Path:
        """Checkpoint under ``path``; returns the checkpoint's path."""
        ...

    def load(self, path: str | os.PathLike) -> None:
        """Restore what ``save`` wrote."""
        ...
