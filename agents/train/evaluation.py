"""Held-out evaluation: one episode per fixed task, greedy by default, summarised as a success rate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.groups import REFILLED, EnvFactory, GroupRequest, stream_groups
from agents.rollout import EpisodeBudget, Renderer
from agents.trajectory import Trajectory
from forge_env.generation.base import Generator, SamplingParams


@dataclass
class EvalResult:
    """What one evaluation found: the success rate and means over its episodes, and the episodes."""

    success_rate: float
    reward_mean: float
    num_episodes: int
    errors: int
    metrics: dict[str, float] = field(default_factory=dict)
    template_drift: int = 0
    """Episodes whose tokens differ from the chat template's re-render (``Trajectory.drift``)."""
    """Means of the environment's rubric metrics (e.g. ``used_tool``) over the episodes."""
    trajectories: list[Trajectory] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {"success_rate": self.success_rate, "reward_mean": self.reward_mean,
                "episodes": float(self.num_episodes), "errors": float(self.errors),
                "template_drift": float(self.template_drift),
                **{f"env/{k}": v for k, v in self.metrics.items()}}


def summarise(trajectories: list[Trajectory], success_threshold: float = 1.0) -> EvalResult:
    """Success rate = share of episodes whose final reward reaches ``success_threshold`` (errors count as failures)."""
    n = len(trajectories)
    sums: dict[str, float] = {}
    for trajectory in trajectories:
        for key, value in trajectory.metrics.items():
            if key != REFILLED and isinstance(value, int | float) and not isinstance(value, bool):
                sums[key] = sums.get(key, 0.0) + float(value)
    return EvalResult(
        success_rate=sum(t.ok and t.reward >= success_threshold for t in trajectories) / n if n else 0.0,
        reward_mean=sum(t.reward for t in trajectories) / n if n else 0.0,
        num_episodes=n,
        errors=sum(not t.ok for t in trajectories),
        metrics={k: v / n for k, v in sorted(sums.items())},
        template_drift=sum(t.drifted for t in trajectories),
        trajectories=trajectories,
    )


async def evaluate(env_factory: EnvFactory, generator: Generator, renderer: Renderer, *, seeds: list[int],
                   sampling: SamplingParams, budget: EpisodeBudget | None = None, success_threshold: float = 1.0,
                   max_episodes_in_flight: int = 64, env_id: str = "") -> EvalResult:
    """Play one episode per seed (in seed order in the result) and summarise them."""
    # Each episode its own sampling seed: one shared stream would correlate the episodes' luck.
    requests = [GroupRequest(seed=seed, n=1, group_id=f"eval-{seed}", sampling_seed=(sampling.seed or 0) + k)
                for k, seed in enumerate(seeds)]
    by_group: dict[str, Trajectory] = {}
    async for group in stream_groups(requests, env_factory, generator, renderer, sampling=sampling, budget=budget,
                                     max_episodes_in_flight=max_episodes_in_flight, env_id=env_id):
        for trajectory in group:
            by_group[trajectory.group_id] = trajectory
    ordered = [by_group[r.group_id] for r in requests]
    return summarise(ordered, success_threshold)


def eval_seeds(start: int, count: int) -> list[int]:
    """The fixed held-out task seeds."""
    return list(range(start, start + count))


def describe(result: EvalResult, label: str) -> str:
    """One line for the console: success rate, mean reward and the env's metrics."""
    extras = " ".join(f"{k}={v:.2f}" for k, v in result.metrics.items())
    return (f"[eval] {label}: success {result.success_rate:.1%} over {result.num_episodes} held-out tasks, "
            f"mean reward {result.reward_mean:.3f}, errors {result.errors}" + (f" ({extras})" if extras else ""))


__all__: list[Any] = ["EvalResult", "describe", "eval_seeds", "evaluate", "summarise"]
