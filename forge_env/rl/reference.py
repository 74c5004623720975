"""ReferenceModel: a frozen copy of the initial policy that scores batches for the KL term.

``annotate(batch)`` fills each sample's ``ref_logprobs`` (what GRPO's k3 KL penalty
compares the policy against); ``logprobs(batch)`` returns them without touching the samples.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence

import torch

from forge_env.rl.device import Precision, autocast, resolve_device, resolve_precision
from forge_env.rl.logprobs import batch_logprobs
from forge_env.rl.trainer import default_pad_token_id, flatten_batch, load_causal_lm
from forge_env.rl.types import TrainSample


class ReferenceModel:
    """Frozen causal LM that computes per-token logprobs (no gradients, eval mode).

    Given a module it keeps its own deep copy (so later training of that module does not
    move the reference), unless ``copy_model=False``.
    """

    def __init__(
        self,
        model: torch.nn.Module | str | os.PathLike,
        *,
        device: str = "auto",
        precision: Precision = "auto",
        micro_batch_size: int = 8,
        max_tokens_per_micro_batch: int | None = None,
        packing: bool = False,
        temperature: float = 1.0,
        pad_token_id: int | None = None,
        copy_model: bool = True,
    ) -> None:
        if isinstance(model, torch.nn.Module) and copy_model:
            model = copy.deepcopy(model)
        self.device = resolve_device(device)
        self.precision = resolve_precision(precision, self.device)
        self.model = load_causal_lm(model).to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
        self.micro_batch_size = micro_batch_size
        self.max_tokens = max_tokens_per_micro_batch
        self.packing = packing
        self.temperature = temperature
        self.pad_token_id = pad_token_id if pad_token_id is not None else default_pad_token_id(self.model)

    def logprobs(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> list[list[float]]:
        """Reference logprob of every token of every sample (0.0 for token 0), aligned with ``token_ids``."""
        return batch_logprobs(
            self.model,
            flatten_batch(batch),
            micro_batch_size=self.micro_batch_size,
            max_tokens=self.max_tokens,
            packing=self.packing,
            pad_token_id=self.pad_token_id,
            temperature=self.temperature,
            autocast=autocast(self.device, self.precision),
        )

    def annotate(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> list[TrainSample]:
        """Set ``ref_logprobs`` on every sample (in place) and return the flat list of samples."""
        samples = flatten_batch(batch)
        for sample, ref in zip(samples, self.logprobs(samples), strict=True):
            sample.ref_logprobs = ref
        return samples
