"""Taking stored tensors as a model's parameters instead of copying them (no torch import here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def can_adopt_weights(model: Any, state_dict: Mapping[str, Any]) -> bool:
    """Whether ``model`` may take ``state_dict``'s tensors as its parameters instead of copying them.

    Only tensors that promise nobody writes them (a weight store's shared-memory views set
    ``immutable_views``), with the device and dtype of the parameters they replace.
    """
    if not getattr(state_dict, "immutable_views", False):
        return False
    current = model.state_dict()
    return all(name in current and current[name].device == tensor.device and current[name].dtype == tensor.dtype
               for name, tensor in state_dict.items())


def retie_embeddings(model: Any) -> None:
    """Tie input and output embeddings again after ``load_state_dict(assign=True)`` replaced them."""
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False) and callable(getattr(model, "tie_weights", None)):
        model.tie_weights()
