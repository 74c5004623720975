"""From finished episodes to the replay buffer: training samples with advantages, and a round's metrics.

Shared by the loop's rounds (:meth:`agents.train.loop.GRPOLoop.collect_round`) and partial rollouts
(:mod:`agents.train.partial`), which ingest one group at a time.
"""

from __future__ import annotations

from typing import Any

from agents.groups import REFILLED, trainable_groups
from agents.train.evaluation import summarise
from agents.trajectory import STATUS_INFRA_ERROR, Trajectory
from forge_env.rl.advantages import AdvantageResult, compute_advantages
from forge_env.rl.types import TrainSample


def train_samples(trajectories: list[Trajectory], config: Any) -> tuple[list[TrainSample], AdvantageResult]:
    """The trainable samples of whole groups of ``trajectories``, with group-relative advantages.

    One sample per episode for the advantages; an episode split into context segments (reasoning
    re-rendered) then trains on each segment with the episode's advantage. A group with an episode the
    machine spoiled and no refill replaced (``agents.groups.lost_for_good``) trains nothing: normalising it
    over the survivors would bias the advantages towards tasks that do not fail (``rollout.lost_episodes``).
    """
    ok = [t for t in trainable_groups(trajectories)[0] if t.ok]
    samples: list[TrainSample] = [t.to_samples()[0] if len(t.segment_starts) > 1 else t.to_sample()
                                  for t in ok if t.num_sampled_tokens > 0]
    advantages = compute_advantages(samples, config.advantages.method,
                                    drop_zero_variance=config.advantages.drop_zero_variance)
    by_episode = {t.episode_id: t for t in ok}
    kept = [segment for sample in advantages.samples
            for segment in _segments(sample, by_episode.get(sample.episode_id))]
    return kept, advantages


def round_metrics(trajectories: list[Trajectory], kept: int, advantages: AdvantageResult, seconds: float,
                  success_threshold: float, extra: dict[str, float]) -> dict[str, float]:
    """The ``rollout/...`` metrics of one round (or, under partial rollouts, of ``groups_per_step`` groups)."""
    summary = summarise(trajectories, success_threshold)
    n = max(len(trajectories), 1)
    return {
        "rollout/reward_mean": summary.reward_mean,
        "rollout/success_rate": summary.success_rate,
        "rollout/episodes": float(len(trajectories)),
        "rollout/errors": float(summary.errors),
        # Machine failures (sandbox errors, dead replicas, stalled tools): dropped, never trained on as 0.
        "rollout/infra_failures": float(sum(t.status == STATUS_INFRA_ERROR for t in trajectories)),
        # rollout.lost_episodes: lost episodes played again, and groups dropped whole for one lost for good.
        "rollout/refills": float(sum(REFILLED in t.metrics for t in trajectories)),
        "rollout/groups_dropped_lost": float(len(trainable_groups(trajectories)[1])),
        "rollout/truncated_frac": sum(t.truncated for t in trajectories) / n,
        "rollout/turns_mean": sum(len(t.turns) for t in trajectories) / n,
        "rollout/sampled_tokens_mean": sum(t.num_sampled_tokens for t in trajectories) / n,
        "rollout/seconds": seconds,
        "rollout/samples_kept": float(kept),
        "rollout/template_drift_frac": sum(t.drifted for t in trajectories) / n,
        "rollout/template_drift_reports": float(sum(len(t.drift) for t in trajectories)),
        "rollout/context_segments_mean": sum(len(t.segment_starts) for t in trajectories) / n,
        **advantages.metrics,
        **extra,
        **{f"rollout/env/{k}": v for k, v in summary.metrics.items()},
    }


def version_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """How many episodes span a weight update, and the prompt tokens their next turns prefilled again.

    A turn sampled by another version than the turn before it found the episode's KV cache dropped by
    the update (unless the generator kept it): it prefilled its whole prompt minus what was cached.
    """
    spanning, reprefilled, switches = 0, 0, 0
    for t in trajectories:
        versions = [turn.policy_version for turn in t.turns]
        spanning += len(set(versions)) > 1
        for before, turn in zip(t.turns, t.turns[1:], strict=False):
            if turn.policy_version != before.policy_version:
                switches += 1
                start = max(s for s in t.segment_starts if s <= turn.gen_start)
                reprefilled += turn.gen_start - start - turn.num_cached_tokens
    n = max(len(trajectories), 1)
    return {"rollout/partial/episodes_spanning_updates_frac": spanning / n,
            "rollout/partial/turns_after_update": float(switches),
            "rollout/partial/reprefilled_tokens": float(reprefilled)}


def _segments(sample: TrainSample, trajectory: Any) -> list[TrainSample]:
    """``sample`` itself, or one sample per context segment of its episode, each with its advantage."""
    if trajectory is None or len(trajectory.segment_starts) == 1:
        return [sample]
    return trajectory.to_samples(sample.advantage)
