"""Turn ``TrainSample``s into model inputs and loss tensors, padded or packed.

The model side (``ModelInputs``) is either right-padded rows with an attention mask, or
one packed row per micro-batch whose position ids restart at 0 for each sample (the
transformers attention mask then becomes block-diagonal, so samples never see each
other). The loss side (``LossTensors``) is always a padded ``(B, T - 1)`` layout shifted by
one token: column ``j`` scores token ``j + 1``. Pads and packing boundaries are outside
every sample's span and carry ``loss_mask == 0``, so they never reach a loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from forge_env.rl.types import TrainSample


@dataclass
class ModelInputs:
    """What the causal LM is called with, plus where each sample sits in it."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    rows: torch.Tensor
    """``(B, T - 1)``: the row of ``input_ids`` whose logits score sample b's token j + 1."""
    cols: torch.Tensor
    """``(B, T - 1)``: the position of those logits (clamped to a valid one past a sample's end)."""


@dataclass
class LossTensors:
    """Per-token loss inputs in the shifted ``(B, T - 1)`` layout."""

    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    lengths: torch.Tensor
    """Number of tokens of each sample (unshifted)."""


def collate(
    samples: Sequence[TrainSample],
    *,
    pad_token_id: int = 0,
    packing: bool = False,
    pad_to_multiple: int = 1,
    device: torch.device | str = "cpu",
) -> tuple[ModelInputs, LossTensors]:
    """Model inputs and loss tensors for ``samples`` (right-padded, or packed into one row).

    ``pad_to_multiple`` rounds the row length up (block-sparse attention kernels want
    multiples of their block size); packed padding forms its own document.
    """
    if not samples:
        raise ValueError("collate needs at least one sample")
    lengths = [s.num_tokens for s in samples]
    width = max(max(lengths) - 1, 1)
    n = len(samples)

    def padded(rows: list[list[float]], dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(n, width, dtype=dtype)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
        return out

    loss = LossTensors(
        loss_mask=padded([s.loss_mask[1:] for s in samples], torch.long),
        old_logprobs=padded([s.old_logprobs[1:] for s in samples], torch.float32),
        ref_logprobs=(
            padded([s.ref_logprobs[1:] for s in samples], torch.float32)  # type: ignore[index]
            if all(s.ref_logprobs is not None for s in samples)
            else None
        ),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        lengths=torch.tensor(lengths, dtype=torch.long),
    )

    j = torch.arange(width)
    if packing:
        starts = torch.tensor([0, *torch.cumsum(torch.tensor(lengths), 0)[:-1].tolist()])
        flat = [t for s in samples for t in s.token_ids]
        positions = [p for n_tok in lengths for p in range(n_tok)]
        # At least two positions (one shifted logprob column), rounded up to the multiple.
        extra = max(2 - len(flat), (-len(flat)) % pad_to_multiple)
        flat, positions = flat + [pad_token_id] * extra, positions + list(range(extra))
        input_ids = torch.tensor([flat], dtype=torch.long)
        position_ids = torch.tensor([positions], dtype=torch.long)
        attention_mask = None
        rows = torch.zeros(n, width, dtype=torch.long)
        cols = (starts.unsqueeze(1) + j.unsqueeze(0)).clamp(max=input_ids.shape[1] - 2)
    else:
        row_len = width + 1 + (-(width + 1)) % pad_to_multiple
        input_ids = torch.full((n, row_len), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(n, row_len, dtype=torch.long)
        for i, s in enumerate(samples):
            input_ids[i, : lengths[i]] = torch.tensor(s.token_ids, dtype=torch.long)
            attention_mask[i, : lengths[i]] = 1
        position_ids = torch.arange(row_len).unsqueeze(0).expand(n, -1)
        rows = torch.arange(n).unsqueeze(1).expand(n, width)
        cols = j.unsqueeze(0).expand(n, width)

    inputs = ModelInputs(
        input_ids=input_ids.to(device),
        attention_mask=None if attention_mask is None else attention_mask.to(device),
        position_ids=position_ids.to(device),
        rows=rows.to(device),
        cols=cols.to(device),
    )
    loss = LossTensors(
        loss_mask=loss.loss_mask.to(device),
        old_logprobs=loss.old_logprobs.to(device),
        ref_logprobs=None if loss.ref_logprobs is None else loss.ref_logprobs.to(device),
        advantages=loss.advantages.to(device),
        lengths=loss.lengths.to(device),
    )
    return inputs, loss


def split_micro_batches(
    samples: Sequence[TrainSample],
    micro_batch_size: int,
    max_tokens: int | None = None,
    *,
    packing: bool = False,
) -> list[list[TrainSample]]:
    """Consecutive chunks of at most ``micro_batch_size`` samples and ``max_tokens`` model tokens.

    ``max_tokens`` counts what the model processes: the sum of lengths when packing, the
    padded size (samples x longest) otherwise. A single sample longer than the budget
    still gets its own micro-batch.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    chunks: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    for sample in samples:
        candidate = [*current, sample]
        over_count = len(candidate) > micro_batch_size
        over_tokens = max_tokens is not None and current and _model_tokens(candidate, packing) > max_tokens
        if over_count or over_tokens:
            chunks.append(current)
            candidate = [sample]
        current = candidate
    if current:
        chunks.append(current)
    return chunks


def _model_tokens(samples: Sequence[TrainSample], packing: bool) -> int:
    lengths = [s.num_tokens for s in samples]
    return sum(lengths) if packing else len(lengths) * max(lengths)
