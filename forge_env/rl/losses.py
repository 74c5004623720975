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

``grpo_loss`` and ``dapo_loss`` are presets of ``ppo_clip_loss`` (its arguments, other defaults: see
:func:`preset`). The shared terms (aggregation, k3 KL, masking, ratio metrics) live in
:mod:`forge_env.rl.loss_terms`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from forge_env.rl.loss_terms import (
    AGGREGATIONS,
    MAX_LOG_RATIO,
    Aggregation,
    LossFn,
    LossOutput,
    add_kl,
    aggregate,
    entropy_metric,
    importance_ratio,
    k3_kl,
    masked_inputs,
    masked_mean,
    ratio_metrics,
    zero_masked,
)

__all__ = [  # AGGREGATIONS, Aggregation, LossFn, LossOutput, aggregate and k3_kl live in forge_env.rl.loss_terms
    "AGGREGATIONS",
    "LOSSES",
    "Aggregation",
    "LossFn",
    "LossOutput",
    "aggregate",
    "cispo_loss",
    "dapo_loss",
    "get_loss",
    "grpo_loss",
    "gspo_loss",
    "k3_kl",
    "ppo_clip_loss",
    "preset",
    "reinforce_loss",
    "sft_loss",
]


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
    logprobs, old_logprobs, adv, ref_logprobs, entropy = masked_inputs(
        mask, logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    ratio = importance_ratio(logprobs, old_logprobs)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    agg = dict(aggregation=aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    pg_loss = aggregate(per_token, mask, **agg)
    loss, kl_metrics = add_kl(pg_loss, logprobs, ref_logprobs, kl_coef, mask, agg)
    with torch.no_grad():
        is_clipped = clipped > unclipped
        metrics = {
            "pg_loss": pg_loss.item(),
            "clip_frac": masked_mean(is_clipped.float(), mask),
            "clip_low_frac": masked_mean((is_clipped & (adv < 0)).float(), mask),
            "clip_high_frac": masked_mean((is_clipped & (adv > 0)).float(), mask),
            **ratio_metrics(ratio, mask),
            **kl_metrics,
            **entropy_metric(entropy, mask),
        }
    metrics["loss"] = loss.item()
    return LossOutput(loss, metrics)


def preset(base: LossFn, name: str, doc: str, **defaults: Any) -> LossFn:
    """``base`` under another name with other keyword defaults (a loss family's published settings).

    The result takes ``base``'s arguments; an argument passed explicitly wins over the preset's default.
    Its ``inspect.signature`` shows the preset's defaults, so callers that read a loss's ``kl_coef`` default
    (the trainer's reference check, the config's) see the preset's.
    """
    signature = inspect.signature(base)
    unknown = sorted(set(defaults) - set(signature.parameters))
    if unknown:
        raise TypeError(f"{base.__name__} has no parameter(s) {unknown} to preset")

    def loss(*args: Any, **kwargs: Any) -> LossOutput:
        return base(*args, **{**defaults, **kwargs})

    loss.__name__ = loss.__qualname__ = name
    loss.__doc__ = doc
    loss.__module__ = base.__module__
    loss.__signature__ = signature.replace(parameters=[  # type: ignore[attr-defined]
        p.replace(default=defaults[p.name]) if p.name in defaults else p for p in signature.parameters.values()])
    return loss


grpo_loss = preset(
    ppo_clip_loss, "grpo_loss",
    """GRPO: the PPO-clip surrogate with a k3 KL to the reference, sequence-mean aggregation.

    ``ppo_clip_loss`` with ``clip_low=clip_high=0.2``, ``kl_coef=0.04``, ``aggregation="seq_mean"``. The KL
    term is skipped when ``ref_logprobs`` is not given or ``kl_coef`` is 0.
    """,
    clip_low=0.2, clip_high=0.2, kl_coef=0.04, aggregation="seq_mean",
)

dapo_loss = preset(
    ppo_clip_loss, "dapo_loss",
    """DAPO: clip-higher (asymmetric clip), token-level aggregation, no KL by default.

    ``ppo_clip_loss`` with ``clip_low=0.2``, ``clip_high=0.28``, ``kl_coef=0.0``, ``aggregation="token_mean"``.
    """,
    clip_low=0.2, clip_high=0.28, kl_coef=0.0, aggregation="token_mean",
)


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
    logprobs, old_logprobs, adv, ref_logprobs, entropy = masked_inputs(
        mask, logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    log_ratio = logprobs - old_logprobs
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)
    seq_log_ratio = seq_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    token_ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach())
    unclipped = -adv * token_ratio
    clipped = -adv * token_ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    agg = dict(aggregation=aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    pg_loss = aggregate(per_token, mask, **agg)
    loss, kl_metrics = add_kl(pg_loss, logprobs, ref_logprobs, kl_coef, mask, agg)
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
            **ratio_metrics(importance_ratio(logprobs, old_logprobs), mask),
            **kl_metrics,
            **entropy_metric(entropy, mask),
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
    logprobs = zero_masked(logprobs, mask)
    loss = aggregate(-logprobs, mask, aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        nll = masked_mean(-logprobs, mask)
    metrics = {"loss": loss.item(), "nll": nll, **entropy_metric(entropy, mask)}
    return LossOutput(loss, metrics)


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
    logprobs, old_logprobs, adv, ref_logprobs, entropy = masked_inputs(
        mask, logprobs, old_logprobs, advantages, ref_logprobs, entropy)
    ratio = importance_ratio(logprobs, old_logprobs).detach()
    weight = ratio.clamp(min=low, max=high) if (low is not None or high is not None) else ratio
    per_token = -weight * adv * logprobs
    agg = dict(aggregation=aggregation, horizon=horizon, num_tokens=num_tokens, num_seqs=num_seqs)
    pg_loss = aggregate(per_token, mask, **agg)
    loss, kl_metrics = add_kl(pg_loss, logprobs, ref_logprobs, kl_coef, mask, agg)
    with torch.no_grad():
        clipped_low = (ratio < low) if low is not None else torch.zeros_like(mask)
        clipped_high = (ratio > high) if high is not None else torch.zeros_like(mask)
        metrics = {
            "pg_loss": pg_loss.item(),
            "clip_frac": masked_mean((clipped_low | clipped_high).float(), mask),
            "clip_low_frac": masked_mean(clipped_low.float(), mask),
            "clip_high_frac": masked_mean(clipped_high.float(), mask),
            "is_weight_mean": masked_mean(weight, mask),
            **ratio_metrics(ratio, mask),
            **kl_metrics,
            **entropy_metric(entropy, mask),
        }
    metrics["loss"] = loss.item()
    return LossOutput(loss, metrics)
