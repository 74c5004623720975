"""Off-policy correction against the sampler's logprobs: truncated and masked importance sampling.

The generator that sampled a batch is not the trainer: its kernels, precision and (in async runs) weights
differ, so ``pi_sampler`` (the ``old_logprobs`` of a ``TrainSample``) is not ``pi_old``, the trainer's own
policy before the step. Training as if it were biases the gradient (Yao et al., "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training"; Liu, Li et al., "When Speed Kills Stability"). The correction
here follows verl's *decoupled* rollout correction:

- the loss's own ratio (PPO/GSPO clip, CISPO/REINFORCE weight) is taken against ``pi_old``. The trainers take
  one optimizer step per batch, so ``pi_old`` is exactly the forward pass's own logprobs, detached; the
  ratio's value is 1 and its gradient the policy gradient;
- the sampler mismatch ``rho = pi_old / pi_sampler`` becomes a per-token weight on the loss:

  * **TIS** (truncated IS), ``tis="token"``: ``w_t = min(rho_t, tis_cap)``; ``tis="sequence"``:
    ``w = min(prod_t rho_t, tis_cap)`` for every token of the sequence;
  * **MIS** (masked IS, rejection), ``mis="token"``: ``w_t = 0`` where ``rho_t`` is outside
    ``[mis_low, mis_high]``; ``mis="sequence"``: the whole sequence where ``prod_t rho_t`` is outside;
    ``mis="geometric"``: where the geometric mean ``exp(mean_t log rho_t)`` is outside (length-independent,
    so its thresholds sit close to 1, e.g. ``[0.999, 1.001]``).

  TIS and MIS compose (weight = truncated ratio x mask); with neither set the loss is untouched and only
  the metrics are added.

The weight multiplies the per-token advantage, which scales every loss of ``forge_env.rl.losses`` term by
term (each is linear in a positive per-token factor on the advantage); the KL penalty is not weighted.
Rejected tokens stay in the denominators with weight 0 (verl drops them from the denominator instead),
so micro-batch losses still add up to the batch loss. Log-ratios are bounded to +-20 before ``exp``.

Metrics, with or without a correction (``off_policy/`` prefix): ``mismatch_abs_mean`` (mean
``|log pi_old - log pi_sampler|`` over sampled tokens), ``mismatch_k3_kl`` (k3 estimate of
KL(sampler || trainer)), ``ratio_max``/``ratio_min`` (token ``rho``), ``tis_truncated_frac`` (share of
sampled tokens whose weight was capped), ``mis_masked_frac`` (share rejected), ``is_weight_mean``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Literal

import torch

from forge_env.rl.loss_terms import (
    MAX_LOG_RATIO,
    LossFn,
    LossOutput,
    k3_kl,
    masked_mean,
    per_token_advantages,
    zero_masked,
)

TISLevel = Literal["token", "sequence"]
MISLevel = Literal["token", "sequence", "geometric"]


@dataclass
class OffPolicyConfig:
    """Which importance-sampling correction against the sampler's logprobs the loss gets (module docstring)."""

    tis: TISLevel | None = None
    """Truncated IS: ``token`` (per-token ratio) or ``sequence`` (product over the sequence); None: off."""
    tis_cap: float = 2.0
    """The truncation ``C``: weights above it become ``C``."""
    mis: MISLevel | None = None
    """Masked IS: reject (weight 0) ``token``s, ``sequence``s or sequences by ``geometric`` mean ratio outside
    ``[mis_low, mis_high]``; None: off."""
    mis_high: float = 2.0
    mis_low: float | None = None
    """Lower bound of the kept ratios; None: ``1 / mis_high``."""

    def __post_init__(self) -> None:
        if self.tis not in (None, "token", "sequence"):
            raise ValueError(f"off_policy.tis must be 'token', 'sequence' or null, got {self.tis!r}")
        if self.mis not in (None, "token", "sequence", "geometric"):
            raise ValueError(f"off_policy.mis must be 'token', 'sequence', 'geometric' or null, got {self.mis!r}")
        if not self.tis_cap > 0:
            raise ValueError(f"off_policy.tis_cap must be > 0, got {self.tis_cap}")
        if not self.mis_high > 0:
            raise ValueError(f"off_policy.mis_high must be > 0, got {self.mis_high}")
        if self.mis_low is not None and not 0 <= self.mis_low < self.mis_high:
            raise ValueError(f"off_policy.mis_low must be in [0, mis_high={self.mis_high}), got {self.mis_low}")

    @property
    def enabled(self) -> bool:
        return self.tis is not None or self.mis is not None

    @property
    def low(self) -> float:
        return self.mis_low if self.mis_low is not None else 1.0 / self.mis_high

    @classmethod
    def coerce(cls, value: OffPolicyConfig | dict[str, Any] | None) -> OffPolicyConfig:
        """``value`` as an ``OffPolicyConfig`` (a dict, e.g. from ``dataclasses.asdict``, or None: off)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"off_policy: unknown option(s) {unknown}; valid: {sorted(known)}")
            return cls(**value)
        raise TypeError(f"off_policy must be an OffPolicyConfig or a dict, got {type(value).__name__}")


@dataclass
class Correction:
    """The per-token weights ``(B, T)`` (0 on unsampled and rejected tokens) and the metrics."""

    weights: torch.Tensor
    metrics: dict[str, float]


@torch.no_grad()
def off_policy_correction(
    trainer_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: OffPolicyConfig,
) -> Correction:
    """The IS weights of ``config`` for ``(B, T)`` logprobs, and the mismatch metrics (module docstring)."""
    mask = loss_mask.bool()
    dtype = torch.promote_types(torch.promote_types(trainer_logprobs.dtype, sampler_logprobs.dtype), torch.float32)
    trainer = zero_masked(trainer_logprobs.detach().to(dtype), mask)
    sampler = zero_masked(sampler_logprobs.detach().to(dtype), mask)
    log_ratio = (trainer - sampler).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = log_ratio.exp()
    n_tok = mask.sum(-1)
    seq_log_ratio = (log_ratio.sum(-1)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    geo_log_ratio = log_ratio.sum(-1) / n_tok.clamp(min=1)

    weights = torch.ones_like(ratio)
    truncated = torch.zeros_like(mask)
    if config.tis == "token":
        truncated = ratio > config.tis_cap
        weights = ratio.clamp(max=config.tis_cap)
    elif config.tis == "sequence":
        seq_ratio = seq_log_ratio.exp().unsqueeze(-1).expand_as(ratio)
        truncated = seq_ratio > config.tis_cap
        weights = seq_ratio.clamp(max=config.tis_cap)

    keep = torch.ones_like(mask)
    low, high = config.low, config.mis_high
    if config.mis == "token":
        keep = (ratio >= low) & (ratio <= high)
    elif config.mis in ("sequence", "geometric"):
        seq = (seq_log_ratio if config.mis == "sequence" else geo_log_ratio).exp()
        keep = ((seq >= low) & (seq <= high)).unsqueeze(-1).expand_as(mask)
    weights = torch.where(mask & keep, weights, torch.zeros_like(weights))

    metrics = {
        "off_policy/mismatch_abs_mean": masked_mean(log_ratio.abs(), mask),
        "off_policy/mismatch_k3_kl": masked_mean(k3_kl(sampler, trainer), mask),
        "off_policy/ratio_max": float(ratio[mask].max()) if mask.any() else 1.0,
        "off_policy/ratio_min": float(ratio[mask].min()) if mask.any() else 1.0,
        "off_policy/tis_truncated_frac": masked_mean((truncated & keep).float(), mask),
        "off_policy/mis_masked_frac": masked_mean((~keep).float(), mask),
        "off_policy/is_weight_mean": masked_mean(weights, mask),
    }
    return Correction(weights, metrics)


def with_off_policy_correction(base: LossFn, config: OffPolicyConfig | dict[str, Any] | None) -> LossFn:
    """``base`` with ``config``'s correction against the sampler's ``old_logprobs`` (module docstring).

    The result takes ``base``'s arguments. With no correction enabled it calls ``base`` unchanged and adds
    the ``off_policy/`` mismatch metrics; otherwise ``base`` gets ``old_logprobs = logprobs.detach()``
    (``pi_old``) and advantages times the IS weights.
    """
    config = OffPolicyConfig.coerce(config)

    @functools.wraps(base)
    def loss(
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        **kwargs: Any,
    ) -> LossOutput:
        correction = off_policy_correction(logprobs, old_logprobs, loss_mask, config)
        if config.enabled:
            mask = loss_mask.bool()
            adv = zero_masked(per_token_advantages(advantages, logprobs), mask) * correction.weights.to(logprobs.dtype)
            out = base(logprobs, logprobs.detach(), adv, loss_mask, **kwargs)
        else:
            out = base(logprobs, old_logprobs, advantages, loss_mask, **kwargs)
        out.metrics.update(correction.metrics)
        return out

    loss.off_policy = config  # type: ignore[attr-defined]
    return loss
