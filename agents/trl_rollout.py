"""TRL's ``GRPOTrainer`` on a forge-env environment, through TRL's ``rollout_func`` hook.

``ForgeEnvRollout`` is the hook: TRL hands it the batch's prompts (each repeated ``num_generations`` times),
it plays that many forge-env episodes with the trainer's own model (an in-process ``HFGenerator`` over the same
weights, so every rollout is on-policy) and returns them token-exact: ``prompt_ids`` are the tokens before the
first assistant turn, ``completion_ids`` everything after (the model's turns, the env's replies, template
markup), ``env_mask`` is the episode's ``loss_mask`` there (TRL trains exactly the sampled tokens, multi-turn
included), ``logprobs`` the sampler's. The env's reward reaches TRL as the ``forge_reward`` field, which
:func:`forge_reward` (the reward function to pass) returns unchanged: TRL's rewards are forge-env's.

The train dataset is only a list of task keys (:meth:`ForgeEnvRollout.dataset`): its ``prompt`` names the
env seed, and the env renders the real prompt. What does not map: an episode that ended in an error
(TRL has no way to leave a sample out, so the step fails with the error), and an episode of several context
segments (``reasoning="rerender"``; TRL takes one sequence per completion).
See ``docs/ecosystem.md``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agents.groups import GroupRequest, rollout_group
from agents.rollout import EpisodeBudget
from agents.trajectory import Trajectory
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams

if TYPE_CHECKING:
    import datasets

_KEY = re.compile(r"^forge-env task seed=(-?\d+)$")


def task_key(seed: int) -> str:
    """The ``prompt`` of the dataset row that stands for env seed ``seed``."""
    return f"forge-env task seed={seed}"


def forge_reward(prompts: Sequence[Any], completions: Sequence[Any], forge_reward: Sequence[float],
                 **kwargs: Any) -> list[float]:
    """TRL reward function: the reward forge-env's env gave each episode (``forge_reward`` from the rollout)."""
    return [float(reward) for reward in forge_reward]


class ForgeEnvRollout:
    """TRL ``rollout_func`` playing episodes of a forge-env env with the trainer's model (see the module doc)."""

    def __init__(self, env_factory: Callable[[], Any], tokenizer: Any, *, sampling: SamplingParams | None = None,
                 budget: EpisodeBudget | None = None, renderer: ChatRenderer | None = None, env_id: str = "",
                 max_batch_size: int = 16) -> None:
        self.env_factory = env_factory
        self.tokenizer = tokenizer
        self.renderer = renderer or ChatRenderer(tokenizer)
        self.sampling = sampling or SamplingParams(temperature=1.0, max_tokens=128)
        self.budget = budget
        self.env_id = env_id
        self.max_batch_size = max_batch_size
        self.trajectories: list[Trajectory] = []
        """Every episode played so far, in the order TRL got them."""

    @staticmethod
    def dataset(seeds: Sequence[int]) -> datasets.Dataset:
        """The train dataset: one row per env seed (``prompt`` is its key, ``seed`` the seed)."""
        import datasets

        return datasets.Dataset.from_dict({"prompt": [task_key(seed) for seed in seeds], "seed": list(seeds)})

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list]:
        groups: list[tuple[int, int]] = []  # (seed, episodes), consecutive equal prompts forming one GRPO group
        for prompt in prompts:
            match = _KEY.match(prompt) if isinstance(prompt, str) else None
            if match is None:
                raise ValueError(f"not a forge-env task key: {prompt!r} (build the dataset with "
                                 "ForgeEnvRollout.dataset(seeds))"[:300])
            seed = int(match.group(1))
            if groups and groups[-1][0] == seed:
                groups[-1] = (seed, groups[-1][1] + 1)
            else:
                groups.append((seed, 1))
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0))
        model = trainer.accelerator.unwrap_model(trainer.model)
        trajectories = asyncio.run(self._play(model, groups, step))
        self.trajectories.extend(trajectories)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "forge_reward": [], "forge_episode_id": []}
        for trajectory in trajectories:
            for key, value in self.completion(trajectory).items():
                out[key].append(value)
        return out

    @staticmethod
    def completion(trajectory: Trajectory) -> dict[str, Any]:
        """One episode as TRL's rollout output fields (prompt, completion, mask, logprobs, reward)."""
        if not trajectory.ok:
            raise RuntimeError(f"episode {trajectory.episode_id} ended with status {trajectory.status!r}: "
                               f"{trajectory.error}")
        if len(trajectory.segment_starts) > 1 or not trajectory.turns:
            raise ValueError(f"episode {trajectory.episode_id} has {len(trajectory.segment_starts)} context segments "
                             f"and {len(trajectory.turns)} turns: TRL takes one sequence with at least one turn")
        start = trajectory.turns[0].gen_start
        return {"prompt_ids": trajectory.token_ids[:start], "completion_ids": trajectory.token_ids[start:],
                "logprobs": trajectory.logprobs[start:], "env_mask": trajectory.loss_mask[start:],
                "forge_reward": trajectory.reward, "forge_episode_id": trajectory.episode_id}

    async def _play(self, model: Any, groups: list[tuple[int, int]], step: int) -> list[Trajectory]:
        from forge_env.generation import make_generator

        training = model.training
        generator = make_generator("hf", model=model, tokenizer=self.tokenizer,
                                   config={"max_batch_size": self.max_batch_size}, policy_version=step)
        try:
            played = await asyncio.gather(*(
                rollout_group(self.env_factory, generator, self.renderer,
                              GroupRequest(seed=seed, n=n, group_id=f"step{step}-task{seed}",
                                           sampling_seed=(step * 1_000_003 + index) * 7919 + seed),
                              sampling=self.sampling, budget=self.budget, env_id=self.env_id)
                for index, (seed, n) in enumerate(groups)))
        finally:
            await generator.aclose()
            model.train(training)
        return [trajectory for group in played for trajectory in group]
