"""TrainerActor and ReferenceActor: TorchTrainer and ReferenceModel in their own Monarch processes.

    trainer = await TrainerActor.options(procs=1).as_actor(model_path, TrainerConfig(loss="grpo"),
                                                             weight_store=store)
    metrics = await trainer.train_step.call_one(batch)
    await trainer.push_weights.call_one(version)

The model argument is a local checkpoint path / model id, or a ``(callable, kwargs)`` pair
built inside the actor's process (e.g. ``(build_tiny_model, {"seed": 0})``), so nothing
large crosses the process boundary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from forge_env.rl.reference import ReferenceModel
from forge_env.rl.trainer import TorchTrainer, TrainerConfig
from forge_env.rl.types import TrainSample
from forge_env.services import ForgeActor, endpoint
from forge_env.weights.backend import WeightsInfo
from forge_env.weights.store import WeightStore

ModelSpec = str | tuple[Callable[..., Any], dict[str, Any]]


def _build(model: ModelSpec) -> Any:
    if isinstance(model, tuple):
        factory, kwargs = model
        return factory(**kwargs)
    return model


class TrainerActor(ForgeActor):
    """A ``TorchTrainer`` behind Monarch endpoints; the model is built in ``setup``."""

    def __init__(self, model: ModelSpec, config: TrainerConfig | None = None, *,
                 weight_store: WeightStore | None = None) -> None:
        self._model = model
        self._config = config
        self._store = weight_store
        self.trainer: TorchTrainer | None = None

    @endpoint
    async def setup(self) -> None:
        self.trainer = TorchTrainer(_build(self._model), self._config, weight_store=self._store)

    @endpoint
    async def train_step(self, batch: list[TrainSample] | list[list[TrainSample]]) -> dict[str, float]:
        return self.trainer.train_step(batch)

    @endpoint
    async def logprobs(self, batch: list[TrainSample]) -> list[list[float]]:
        return self.trainer.logprobs(batch)

    @endpoint
    async def push_weights(self, version: int) -> WeightsInfo:
        return self.trainer.push_weights(version)

    @endpoint
    async def step(self) -> int:
        return self.trainer.step

    @endpoint
    async def save(self, path: str) -> str:
        return os.fspath(self.trainer.save(path))

    @endpoint
    async def load(self, path: str) -> None:
        self.trainer.load(path)


class ReferenceActor(ForgeActor):
    """A ``ReferenceModel`` behind Monarch endpoints (``annotate`` returns the samples with ``ref_logprobs``)."""

    def __init__(self, model: ModelSpec, **kwargs: Any) -> None:
        self._model = model
        self._kwargs = kwargs
        self.reference: ReferenceModel | None = None

    @endpoint
    async def setup(self) -> None:
        self.reference = ReferenceModel(_build(self._model), copy_model=False, **self._kwargs)

    @endpoint
    async def logprobs(self, batch: list[TrainSample]) -> list[list[float]]:
        return self.reference.logprobs(batch)

    @endpoint
    async def annotate(self, batch: list[TrainSample]) -> list[TrainSample]:
        return self.reference.annotate(batch)
