"""What an update's weights must look like before a generator lets them near a live model.

A weight update is checked against the model's own parameter list (names, shapes, dtypes in checkpoint
format), read from its config on the meta device: no memory, no weights, any transformers architecture.
An update must name every parameter (a tied LM head may be left out, as checkpoints do), with the same
shape and a floating dtype where the model has one (other float dtypes are cast on load). A mismatch is
refused with the first few offending names, before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge_env.weights.errors import WeightMismatchError

_TIED_HEAD = "lm_head.weight"
_SHOW = 5


@dataclass(frozen=True)
class ModelWeightSpecs:
    """A model's parameters in checkpoint format, and whether its LM head is tied to the embedding."""

    specs: Mapping[str, Any]  # name -> forge_env.weights.safetensors_io.TensorSpec
    tied_head: bool

    @classmethod
    def from_pretrained(cls, model: str | Path) -> ModelWeightSpecs:
        """The specs of the model at ``model`` (a checkpoint directory or hub id), from its config alone."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from forge_env.weights.safetensors_io import TensorSpec

        config = AutoConfig.from_pretrained(str(model))
        with torch.device("meta"):
            meta_model = AutoModelForCausalLM.from_config(config)
        specs = {name: TensorSpec(t.dtype, tuple(t.shape)) for name, t in meta_model.state_dict().items()}
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        return cls(specs, bool(getattr(text_config, "tie_word_embeddings", False)))

    def check(self, update: Mapping[str, Any], what: str) -> None:
        """Raise ``WeightMismatchError`` unless ``update`` (name -> tensor or ``TensorSpec``) fits the model."""
        import torch

        optional = {_TIED_HEAD} if self.tied_head else set()
        missing = sorted(set(self.specs) - set(update) - optional)
        unexpected = sorted(set(update) - set(self.specs))
        problems = []
        if missing:
            problems.append(f"missing {len(missing)} parameters {missing[:_SHOW]}")
        if unexpected:
            problems.append(f"{len(unexpected)} unknown names {unexpected[:_SHOW]}")
        shapes, dtypes = [], []
        for name, given in update.items():
            expected = self.specs.get(name)
            if expected is None:
                continue
            shape = tuple(given.shape)
            if shape != expected.shape:
                shapes.append(f"{name}: {list(shape)} (model: {list(expected.shape)})")
            if expected.dtype.is_floating_point and given.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                dtypes.append(f"{name}: {given.dtype}")
        if shapes:
            problems.append(f"{len(shapes)} wrong shapes: {'; '.join(shapes[:_SHOW])}")
        if dtypes:
            problems.append(f"{len(dtypes)} tensors not float32/bfloat16/float16: {'; '.join(dtypes[:_SHOW])}")
        if problems:
            raise WeightMismatchError(f"{what} does not fit the model: {', '.join(problems)}")
