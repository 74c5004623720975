"""The terms every loss of :mod:`forge_env.rl.losses` is built from.

``LossOutput``, the aggregation modes (``aggregate``), the k3 KL estimator, and the helpers (shared by ``losses`` and ``off_policy``) that zero
masked positions before any arithmetic, compute the clamped importance ratio, add the KL penalty and report
the ratio/entropy metrics. The conventions (shapes, masks, aggregation) are documented in ``losses``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean", "fixed_horizon"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean", "fixed_horizon")

# exp() of a log-ratio beyond this overflows usefulness; gradients there are clipped anyway.
MAX_LOG_RATIO = 20.0


@dataclass
class LossOutput:
    """A scalar loss (with gradient) and float metrics describing it."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


LossFn = Callable[..., LossOutput]


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    aggregation: Aggregation = "token_mean",
    *,
    horizon: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` ``(B, T)`` over the positions where ``loss_mask`` is 1."""
    mask = loss_mask.bool()
    masked = torch.where(mask, values, torch.zeros_like(values))
    if aggregation == "token_mean":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1)
        return masked.sum() / denom
    if aggregation == "seq_mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        denom = num_seqs if num_seqs is not None else values.shape[0]
        return per_seq.sum() / denom
    if aggregation == "fixed_horizon":
        if not horizon or horizon <= 0:
            raise ValueError("aggregation='fixed_horizon' needs horizon= (the max number of generated tokens)")
        denom = num_seqs if num_seqs is not None else values.shape[0]
        return masked.sum() / (denom * horizon)
    raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {AGGREGATIONS}")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): ``exp(r - p) - (r - p) - 1`` (>= 0)."""
    delta = (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return delta.exp() - delta - 1.0



def zero_masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with masked positions replaced by 0 (a select, so their NaN/inf reaches no gradient)."""
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_inputs(
    mask: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Every per-token input with its masked positions zeroed before any arithmetic.

    Multiplying by the mask afterwards is not enough: ``0 * NaN`` is NaN, and so is the
    gradient of ``exp`` or a product at a NaN/inf position even when the loss ignores it.
    """
    adv = zero_masked(per_token_advantages(advantages, logprobs), mask)
    ref = None if ref_logprobs is None else zero_masked(ref_logprobs, mask)
    ent = None if entropy is None else zero_masked(entropy, mask)
    return zero_masked(logprobs, mask), zero_masked(old_logprobs, mask), adv, ref, ent


def per_token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    advantages = advantages.to(like.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.expand_as(like)


def importance_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return torch.exp((logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def add_kl(
    pg_loss: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    kl_coef: float,
    mask: torch.Tensor,
    agg: dict,
) -> tuple[torch.Tensor, dict[str, float]]:
    if ref_logprobs is None:
        return pg_loss, {}
    kl = k3_kl(logprobs, ref_logprobs)
    metrics = {"kl": masked_mean(kl.detach(), mask)}
    if kl_coef == 0.0:
        return pg_loss, metrics
    return pg_loss + kl_coef * aggregate(kl, mask, **agg), metrics


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    if n == 0:
        return 0.0
    return float(torch.where(mask, values, torch.zeros_like(values)).sum()) / n


def ratio_metrics(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    if not mask.any():
        return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    picked = ratio[mask]
    return {"ratio_mean": float(picked.mean()), "ratio_min": float(picked.min()), "ratio_max": float(picked.max())}


def entropy_metric(entropy: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    return {} if entropy is None else {"entropy": masked_mean(entropy, mask)}
