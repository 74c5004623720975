"""Policy-gradient and SFT losses as pure functions over per-token tensors.

Every loss takes ``(logprobs, old_logprobs, advantages, loss_mask)`` where ``logprobs``
are the current policy's (with gradient), ``old_logprobs`` the sampler's, all ``(B, T)``
and aligned with the tokens they score, ``advantages`` ``(B,)`` or ``(B, T)``, and
``loss_mask`` 1 on the tokens the policy sampled. Masked positions never reach the loss,
its gradient or the metrics, whatever values they hold (pads, prompt tokens, NaN, inf).

Aggregation (``aggregation=``):

- ``"token_mean"``: sum over all sampled tokens / number of sampled tokens (DAPO);
- ``"seq_mean"``: mean over sequences of each sequence's token mean (original GRPO);
- ``"fixed_horizon"``: sum over tokens / (sequences * ``horizon``) (Dr. GRPO's constant normaliser).

``num_tokens``/``num_seqs`` override the denominators so that the losses of micro-batches
add up to the loss of the whole batch under gradient accumulation.

Each function returns a ``LossOutput``: the scalar loss and float metrics (``*_min`` /
``*_max`` keys are extremes, the rest are means over sampled tokens unless named otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean", "fixed_horizon"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean", "fixed_horizon")

# exp() of a log-ratio beyond this overflows usefulness; gradients there are clipped anyway.
_MAX_LOG_RATIO = 20.0


@dataclass
class LossOutput:
    """A scalar loss (with gradient) and float metrics describing it."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


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
    delta = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return delta.exp() - delta - 1.0


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "seq_mean",
    horizon: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """PPO clipped surrogate with separate clip-low/clip-high and an optional k3 KL penalty.

    Per token: ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) + kl_coef * k3``, with
    ``r = exp(logprobs - old_logprobs)``.
    """
    mask = loss_mask.bool()
    logprobs, old_logprobs, adv, ref_logprobs, entropy = _masked_inputs(
        mask, logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    ratio = _ratio(logprobs, old_logprobs)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    agg = dict(aggregation=aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    pg_loss = aggregate(per_token, mask, **agg)
    loss, kl_metrics = _add_kl(pg_loss, logprobs, ref_logprobs, kl_coef, mask, agg)
    with torch.no_grad():
        is_clipped = clipped > unclipped
        metrics = {
            "pg_loss": pg_loss.item(),
            "clip_frac": _masked_mean(is_clipped.float(), mask),
            "clip_low_frac": _masked_mean((is_clipped & (adv < 0)).float(), mask),
            "clip_high_frac": _masked_mean((is_clipped & (adv > 0)).float(), mask),
            **_ratio_metrics(ratio, mask),
            **kl_metrics,
            **_entropy_metric(entropy, mask),
        }
    metrics["loss"] = loss.item()
    return LossOutput(loss, metrics)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    kl_coef: float = 0.04,
    aggregation: Aggregation = "seq_mean",
    **kwargs,
) -> LossOutput:
    """GRPO: the PPO-clip surrogate with a k3 KL to the reference, sequence-mean aggregation.

    The KL term is skipped when ``ref_logprobs`` is not given or ``kl_coef`` is 0.
    """
    return ppo_clip_loss(
        logprobs, old_logprobs, advantages, loss_mask,
        clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef, aggregation=aggregation, **kwargs,
    )  # fmt: skip


def dapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token_mean",
    **kwargs,
) -> LossOutput:
    """DAPO: clip-higher (asymmetric clip), token-level aggregation, no KL by default."""
    return ppo_clip_loss(
        logprobs, old_logprobs, advantages, loss_mask,
        clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef, aggregation=aggregation, **kwargs,
    )  # fmt: skip


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "seq_mean",
    horizon: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """GSPO: one importance ratio per sequence, ``exp(mean_t(logprobs - old_logprobs))``.

    Uses the GSPO-token form ``s_t = sg(s) * exp(logprobs_t - sg(logprobs_t))`` so per-token
    advantages work too; with sequence advantages its gradient equals sequence-level GSPO.
    The clip range is tiny by default (3e-4 / 4e-4) because the ratio is length-normalised.
    """
    mask = loss_mask.bool()
    logprobs, old_logprobs, adv, ref_logprobs, entropy = _masked_inputs(
        mask, logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    log_ratio = logprobs - old_logprobs
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)
    seq_log_ratio = seq_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    token_ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach())
    unclipped = -adv * token_ratio
    clipped = -adv * token_ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    agg = dict(aggregation=aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    pg_loss = aggregate(per_token, mask, **agg)
    loss, kl_metrics = _add_kl(pg_loss, logprobs, ref_logprobs, kl_coef, mask, agg)
    with torch.no_grad():
        has_tokens = mask.any(-1)
        seq_ratio = seq_log_ratio.exp()
        seq_clipped = ((clipped > unclipped) & mask).any(-1)
        n_seqs = max(int(has_tokens.sum()), 1)
        metrics = {
            "pg_loss": pg_loss.item(),
            "clip_frac": float(seq_clipped.sum()) / n_seqs,
            "seq_ratio_mean": float(seq_ratio[has_tokens].sum()) / n_seqs,
            "seq_ratio_min": float(seq_ratio[has_tokens].min()) if has_tokens.any() else 1.0,
            "seq_ratio_max": float(seq_ratio[has_tokens].max()) if has_tokens.any() else 1.0,
            **_ratio_metrics(_ratio(logprobs, old_logprobs), mask),
            **kl_metrics,
            **_entropy_metric(entropy, mask),
        }
    metrics["loss"] = loss.item()
    return LossOutput(loss, metrics)


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token_mean",
    **kwargs,
) -> LossOutput:
    """CISPO (MiniMax-M1): ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logprobs``.

    The importance weight is clipped and detached, so every token keeps a gradient (unlike
    PPO, which zeroes clipped tokens). ``clip_low=None`` leaves the weight unbounded below.
    """
    low = None if clip_low is None else 1.0 - clip_low
    return _weighted_pg_loss(
        logprobs, old_logprobs, advantages, loss_mask, low=low, high=1.0 + clip_high,
        ref_logprobs=ref_logprobs, kl_coef=kl_coef, aggregation=aggregation, **kwargs,
    )  # fmt: skip


def reinforce_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    is_cap: float | None = 2.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token_mean",
    **kwargs,
) -> LossOutput:
    """REINFORCE with truncated importance weights: ``-sg(min(r, is_cap)) * A * logprobs``.

    ``is_cap=None`` means plain importance sampling; the truncation (TIS) bounds the
    variance that sampler/trainer mismatch and stale samples would otherwise add.
    """
    return _weighted_pg_loss(
        logprobs, old_logprobs, advantages, loss_mask, low=None, high=is_cap,
        ref_logprobs=ref_logprobs, kl_coef=kl_coef, aggregation=aggregation, **kwargs,
    )  # fmt: skip


def sft_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    *,
    aggregation: Aggregation = "token_mean",
    horizon: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    entropy: torch.Tensor | None = None,
    **_ignored,
) -> LossOutput:
    """Cross-entropy on the masked tokens (``-logprobs``); sampler logprobs and advantages are unused."""
    mask = torch.ones_like(logprobs, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
    logprobs = _zero_masked(logprobs, mask)
    loss = aggregate(-logprobs, mask, aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        nll = _masked_mean(-logprobs, mask)
    metrics = {"loss": loss.item(), "nll": nll, **_entropy_metric(entropy, mask)}
    return LossOutput(loss, metrics)


LossFn = Callable[..., LossOutput]

LOSSES: dict[str, LossFn] = {
    "grpo": grpo_loss,
    "ppo": ppo_clip_loss,
    "dapo": dapo_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "reinforce": reinforce_loss,
    "sft": sft_loss,
}


def get_loss(name: str) -> LossFn:
    """The loss function registered under ``name`` (see ``LOSSES``)."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}") from None


def _weighted_pg_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    low: float | None,
    high: float | None,
    ref_logprobs: torch.Tensor | None,
    kl_coef: float,
    aggregation: Aggregation,
    horizon: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    mask = loss_mask.bool()
    logprobs, old_logprobs, adv, ref_logprobs, entropy = _masked_inputs(
        mask, logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    ratio = _ratio(logprobs, old_logprobs).detach()
    weight = ratio.clamp(min=low, max=high) if (low is not None or high is not None) else ratio
    per_token = -weight * adv * logprobs
    agg = dict(aggregation=aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    pg_loss = aggregate(per_token, mask, **agg)
    loss, kl_metrics = _add_kl(pg_loss, logprobs, ref_logprobs, kl_coef, mask, agg)
    with torch.no_grad():
        clipped_low = (ratio < low) if low is not None else torch.zeros_like(mask)
        clipped_high = (ratio > high) if high is not None else torch.zeros_like(mask)
        metrics = {
            "pg_loss": pg_loss.item(),
            "clip_frac": _masked_mean((clipped_low | clipped_high).float(), mask),
            "clip_low_frac": _masked_mean(clipped_low.float(), mask),
            "clip_high_frac": _masked_mean(clipped_high.float(), mask),
            "is_weight_mean": _masked_mean(weight, mask),
            **_ratio_metrics(ratio, mask),
            **kl_metrics,
            **_entropy_metric(entropy, mask),
        }
    metrics["loss"] = loss.item()
    return LossOutput(loss, metrics)


def _zero_masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with masked positions replaced by 0 (a select, so their NaN/inf reaches no gradient)."""
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def _masked_inputs(
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
    adv = _zero_masked(_per_token(advantages, logprobs), mask)
    ref = None if ref_logprobs is None else _zero_masked(ref_logprobs, mask)
    ent = None if entropy is None else _zero_masked(entropy, mask)
    return _zero_masked(logprobs, mask), _zero_masked(old_logprobs, mask), adv, ref, ent


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    advantages = advantages.to(like.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.expand_as(like)


def _ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return torch.exp((logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def _add_kl(
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
    metrics = {"kl": _masked_mean(kl.detach(), mask)}
    if kl_coef == 0.0:
        return pg_loss, metrics
    return pg_loss + kl_coef * aggregate(kl, mask, **agg), metrics


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    if n == 0:
        return 0.0
    return float(torch.where(mask, values, torch.zeros_like(values)).sum()) / n


def _ratio_metrics(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    if not mask.any():
        return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    picked = ratio[mask]
    return {"ratio_mean": float(picked.mean()), "ratio_min": float(picked.min()), "ratio_max": float(picked.max())}


def _entropy_metric(entropy: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    return {} if entropy is None else {"entropy": _masked_mean(entropy, mask)}
