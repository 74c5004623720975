"""Turning next-token logits into sampled tokens and the sampler's logprobs.

``sampling_logprobs`` gives the log-probabilities of the distribution actually sampled from: logits
divided by the temperature, then top-k and top-p filtering (filtered tokens get ``-inf``), then
renormalised. Greedy rows (temperature 0) report the unfiltered model distribution (``log_softmax`` of the
raw logits), since the sampled distribution is a point mass. The same function recomputes these logprobs
from a training forward pass, so sampler and trainer agree on what a logprob means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from forge_env.generation.base import SamplingParams

LogprobsMode = Literal["processed", "raw"]


def sampling_logprobs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Log-probs ``[rows, vocab]`` of each row's sampling distribution (see the module docstring)."""
    logits = logits.float()
    device = logits.device
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)
    scaled = logits / temps[:, None]
    top_k = torch.tensor([0 if p.greedy else p.top_k for p in params], device=device)
    top_p = torch.tensor([1.0 if p.greedy else p.top_p for p in params], device=device)
    vocab = scaled.shape[-1]
    use_top_k = (top_k > 0) & (top_k < vocab)
    if bool(use_top_k.any()):
        k = torch.where(use_top_k, top_k, vocab).clamp(max=vocab)
        kth = scaled.topk(int(k.max()), dim=-1).values.gather(-1, (k - 1)[:, None])
        scaled = scaled.masked_fill(use_top_k[:, None] & (scaled < kth), float("-inf"))
    use_top_p = top_p < 1.0
    if bool(use_top_p.any()):
        sorted_logits, order = scaled.sort(dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop the low-probability tail whose total mass is <= 1 - top_p; the most likely token always stays.
        drop_sorted = cumulative <= (1 - top_p)[:, None]
        drop_sorted[:, -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(use_top_p[:, None] & drop, float("-inf"))
    return scaled.log_softmax(dim=-1)


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    logprobs_mode: LogprobsMode = "processed",
) -> tuple[list[int], list[float]]:
    """Sample one token per row of ``logits`` ``[rows, vocab]``; return ``(tokens, logprobs)``.

    Each row draws from its own ``torch.Generator`` so a seeded request samples the same tokens
    whatever else shares its batch.
    """
    logprobs = sampling_logprobs(logits, params)
    tokens: list[int] = []
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        if p.greedy:
            tokens.append(int(logits[row].argmax()))
        else:
            probs = logprobs[row].exp()
            tokens.append(int(torch.multinomial(probs, 1, generator=generator)))
    index = torch.tensor(tokens, device=logits.device)[:, None]
    if logprobs_mode == "raw":
        chosen = logits.float().log_softmax(dim=-1).gather(-1, index)
    else:
        chosen = logprobs.gather(-1, index)
    return tokens, chosen[:, 0].tolist()
