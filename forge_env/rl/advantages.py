"""Group-relative advantages for GRPO-style training.

Samples that answer the same prompt share a ``group_id``; each sample's advantage is
its reward compared with the others in its group:

- ``"grpo"``: ``(r - mean) / (std + eps)`` with the sample standard deviation (DeepSeekMath GRPO);
- ``"dr_grpo"``: ``r - mean`` (Dr. GRPO drops the std division, which biases towards easy/hard prompts);
- ``"loo"``: ``r - mean of the other samples`` (RLOO leave-one-out baseline).

A group whose rewards are all equal carries no learning signal (every advantage is 0);
such groups are reported, and dropped when ``drop_zero_variance=True`` (DAPO's dynamic
sampling filter).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from forge_env.rl.types import TrainSample

AdvantageMode = Literal["grpo", "dr_grpo", "loo"]
ADVANTAGE_MODES: tuple[str, ...] = ("grpo", "dr_grpo", "loo")


@dataclass
class AdvantageResult:
    """What ``compute_advantages`` returns: the samples kept and what it found on the way."""

    samples: list[TrainSample]
    zero_variance_groups: list[str] = field(default_factory=list)
    dropped: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def group_advantages(rewards: Sequence[float], mode: AdvantageMode = "grpo", eps: float = 1e-6) -> list[float]:
    """Advantages for one group of rewards (all zeros when the rewards do not vary)."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; choose one of {ADVANTAGE_MODES}")
    n = len(rewards)
    if n == 0:
        return []
    if is_zero_variance(rewards):
        return [0.0] * n
    mean = sum(rewards) / n
    if mode == "dr_grpo":
        return [r - mean for r in rewards]
    if mode == "loo":
        total = sum(rewards)
        return [r - (total - r) / (n - 1) for r in rewards]
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + eps) for r in rewards]


def compute_advantages(
    samples: Sequence[TrainSample],
    mode: AdvantageMode = "grpo",
    *,
    drop_zero_variance: bool = False,
    eps: float = 1e-6,
) -> AdvantageResult:
    """Set ``advantage`` on every sample (in place) from its group's rewards.

    Every sample needs a ``group_id``. Groups are formed from the samples passed in, so
    pass whole groups. Returns the samples kept (all, or those of groups with varying
    rewards when ``drop_zero_variance``), the ids of zero-variance groups and metrics.
    """
    groups: dict[str, list[TrainSample]] = {}
    for sample in samples:
        if sample.group_id is None:
            raise ValueError(
                f"sample {sample.episode_id!r} has no group_id; group-relative advantages need the samples of "
                "one prompt to share a group_id"
            )
        groups.setdefault(sample.group_id, []).append(sample)

    kept: list[TrainSample] = []
    zero_variance: list[str] = []
    for gid, members in groups.items():
        rewards = [s.reward for s in members]
        for sample, adv in zip(members, group_advantages(rewards, mode, eps), strict=True):
            sample.advantage = adv
        if is_zero_variance(rewards):
            zero_variance.append(gid)
            if drop_zero_variance:
                continue
        kept.extend(members)

    rewards_all = [s.reward for s in samples]
    n_groups = len(groups)
    metrics = {
        "advantages/num_groups": float(n_groups),
        "advantages/zero_variance_groups": float(len(zero_variance)),
        "advantages/zero_variance_frac": len(zero_variance) / n_groups if n_groups else 0.0,
        "advantages/reward_mean": sum(rewards_all) / len(rewards_all) if rewards_all else 0.0,
        "advantages/abs_mean": sum(abs(s.advantage) for s in kept) / len(kept) if kept else 0.0,
    }
    return AdvantageResult(kept, zero_variance, len(samples) - len(kept), metrics)


def is_zero_variance(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    """Whether a group's rewards carry no signal: fewer than two, or all equal (within ``tol``)."""
    return len(rewards) < 2 or max(rewards) - min(rewards) <= tol
