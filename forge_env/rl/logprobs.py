"""Per-token log-probabilities and entropies from a causal LM's logits.

Position ``t`` of the logits predicts token ``t + 1``; these helpers take logits and
targets that are already aligned (``logits[:, t]`` scores ``targets[:, t]``) and work in
float32 whatever the model's dtype, so bf16 training compares logprobs at full precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import torch

from forge_env.rl.batching import ModelInputs, collate, split_micro_batches
from forge_env.rl.types import TrainSample


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log p(targets[..., t] | logits[..., t, :] / temperature)`` with the shape of ``targets``."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} are not aligned")
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of each position's next-token distribution (no gradient: a metric)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


#: A shared prefix shorter than this is run once per row anyway (two model calls cost more than they save).
MIN_SHARED_PREFIX = 16


def model_token_logprobs(
    model: torch.nn.Module,
    inputs: ModelInputs,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a causal LM on collated inputs; per-token logprobs (and entropies) in the ``(B, T - 1)`` layout.

    Column ``j`` of sample ``b`` is the logprob of its token ``j + 1``; columns past a
    sample's end hold junk that the loss mask excludes. With ``share_prefix``, the leading tokens that
    every row of a padded batch shares (a system prompt, a GRPO group's prompt) run once instead of once
    per row (:func:`shared_prefix_logits`): the same logprobs and gradients up to float rounding.
    """
    prefix = shared_prefix_length(inputs) if share_prefix else 0
    if prefix >= MIN_SHARED_PREFIX:
        logits = shared_prefix_logits(model, inputs, prefix)
    else:
        logits = model(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            use_cache=False,  # with a cache, transformers ignores packed position ids
        ).logits
    return gather_token_logprobs(logits, inputs, temperature=temperature, with_entropy=with_entropy)


def shared_prefix_length(inputs: ModelInputs) -> int:
    """How many leading tokens all rows of a right-padded batch share, leaving every row at least one of its own
    tokens; 0 for a packed batch or a single row."""
    ids, mask = inputs.input_ids, inputs.attention_mask
    if mask is None or ids.shape[0] < 2:
        return 0
    same = (ids == ids[:1]).all(dim=0).long()
    return min(int(same.cumprod(dim=0).sum()), int(mask.sum(dim=1).min()) - 1)


def shared_prefix_logits(model: torch.nn.Module, inputs: ModelInputs, prefix: int) -> torch.Tensor:
    """The logits of a right-padded batch whose rows share their first ``prefix`` tokens, computed with those
    tokens run once: one row through the prefix (keeping its keys and values), then every row's rest
    attending to them. Autograd sums the rows' gradients through the shared part, so the loss and its
    gradient are those of the plain forward up to rounding (the matmuls have other shapes)."""
    from transformers import DynamicCache

    rows = inputs.input_ids.shape[0]
    cache = DynamicCache()
    head = model(input_ids=inputs.input_ids[:1, :prefix], position_ids=inputs.position_ids[:1, :prefix],
                 past_key_values=cache, use_cache=True).logits
    if cache.get_seq_length() != prefix:
        raise RuntimeError(f"{type(model).__name__} did not fill its KV cache; it cannot share a prefix "
                           "(set the trainer's share_prefix=False)")
    for layer in cache.layers:
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)
    tail = model(input_ids=inputs.input_ids[:, prefix:], attention_mask=inputs.attention_mask,
                 position_ids=inputs.position_ids[:, prefix:], past_key_values=cache, use_cache=True).logits
    return torch.cat([head.expand(rows, -1, -1), tail], dim=1)


def gather_token_logprobs(
    logits: torch.Tensor,
    inputs: ModelInputs,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs (and entropies) of ``inputs``' samples from the logits of its rows, in ``(B, T - 1)``."""
    shifted = logits[:, :-1]
    row_logprobs = token_logprobs(shifted, inputs.input_ids[:, 1:], temperature)
    logprobs = row_logprobs[inputs.rows, inputs.cols]
    entropy = token_entropy(shifted, temperature)[inputs.rows, inputs.cols] if with_entropy else None
    return logprobs, entropy


@torch.no_grad()
def batch_logprobs(
    model: torch.nn.Module,
    samples: Sequence[TrainSample],
    *,
    micro_batch_size: int = 8,
    max_tokens: int | None = None,
    packing: bool = False,
    pad_token_id: int = 0,
    temperature: float = 1.0,
    autocast: AbstractContextManager | None = None,
) -> list[list[float]]:
    """Logprob of every token of every sample under ``model`` (0.0 for token 0), aligned with ``token_ids``."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for chunk in split_micro_batches(samples, micro_batch_size, max_tokens, packing=packing):
        inputs, _ = collate(chunk, pad_token_id=pad_token_id, packing=packing, device=device)
        with autocast or nullcontext():
            logprobs, _ = model_token_logprobs(model, inputs, temperature=temperature)
        rows = logprobs.float().cpu().tolist()
        out.extend([0.0, *row[: s.num_tokens - 1]] for s, row in zip(chunk, rows, strict=True))
    return out
