"""Groups, honestly (issue 47): an episode the machine spoiled is refilled or its group dropped whole, never
normalised over the survivors (``rollout.lost_episodes``, ``agents.groups``, ``agents.train.ingest``).

The episodes here are played by a deterministic generator (its tokens a function of the sampling seed) against
a one-turn env whose reward is a function of the sampled text, so a refilled group is token for token the group
an uninterrupted run plays.
"""

from __future__ import annotations

import random

import pytest

from agents.groups import REFILLED, GroupRequest, LostEpisodes, lost_for_good, stream_groups
from agents.train.config import load_grpo_config
from agents.train.ingest import round_metrics, train_samples
from agents.train.sampling import RoundSampler, SequentialTasks
from agents.trajectory import STATUS_INFRA_ERROR, Trajectory
from forge_env.chat import ChatRenderer
from forge_env.config import ConfigError
from forge_env.generation.base import Completion, SamplingParams
from forge_env.models import build_byte_tokenizer
from forge_env.services import ReplicaFailedError

TOKENIZER = build_byte_tokenizer()
RENDERER = ChatRenderer(TOKENIZER)
LETTERS = [TOKENIZER.encode(c, add_special_tokens=False)[0] for c in "abcdefgh"]


class SeededGenerator:
    """Four letters drawn from the sampling seed: the same seed, the same tokens, whatever else runs."""

    policy_version = 0

    async def generate(self, prompt_ids, sampling=None, session_id=None) -> Completion:
        rng = random.Random(sampling.seed)
        ids = [rng.choice(LETTERS) for _ in range(4)]
        return Completion(prompt_ids=list(prompt_ids), token_ids=ids, logprobs=[-1.0] * len(ids),
                          text=TOKENIZER.decode(ids), finish_reason="stop", policy_version=0)

    async def release_session(self, session_id) -> None:
        pass

    async def update_weights(self, version) -> None:
        pass


class OneTurnEnv:
    """Rewards an answer by how many 'a' it holds; loses its replica at the step when its factory says so."""

    def __init__(self, factory: Factory) -> None:
        self.factory = factory

    async def areset(self, *, seed=None, options=None):
        return [{"role": "user", "content": f"task {seed}"}], {}

    async def astep(self, action):
        text = action if isinstance(action, str) else action.get("content", "")
        if self.factory.loses(text):
            raise ReplicaFailedError("the replica holding the episode died (injected)")
        return [], float(text.count("a")), True, False, {}


class Factory:
    """Makes the envs; the first ``times`` steps given ``action`` (one episode's answer, a function of its
    sampling seed) lose their replica."""

    def __init__(self, action: str | None = None, times: int = 0) -> None:
        self.action, self.times = action, times

    def loses(self, text: str) -> bool:
        if text != self.action or self.times <= 0:
            return False
        self.times -= 1
        return True

    def __call__(self) -> OneTurnEnv:
        return OneTurnEnv(self)


def answer(trajectories: list[Trajectory], episode_id: str) -> str:
    """The episode's answer (unique in its group, so a Factory can lose exactly that episode)."""
    answers = {t.episode_id: t.messages[-1]["content"] for t in trajectories}
    assert len(set(answers.values())) == len(answers)
    return answers[episode_id]


async def play(requests, factory, lost_episodes=None) -> list[Trajectory]:
    sampling = SamplingParams(temperature=1.0, max_tokens=4, seed=7)
    out: list[Trajectory] = []
    async for group in stream_groups(requests, factory, SeededGenerator(), RENDERER, sampling=sampling,
                                     max_episodes_in_flight=1, lost_episodes=lost_episodes):
        out.extend(group)
    return out


def request(n=4, task=3) -> GroupRequest:
    return GroupRequest(seed=task, n=n, group_id=f"g{task}")


class Config:
    class advantages:
        method = "grpo"
        drop_zero_variance = False


def advantages_by_episode(trajectories):
    kept, _ = train_samples(trajectories, Config)
    return {s.episode_id: round(s.advantage, 6) for s in kept}


def test_a_group_with_an_episode_lost_for_good_is_not_normalised_over_its_survivors():
    survivors = [Trajectory(episode_id=f"g-{i}", group_id="g", reward=float(i), token_ids=[1, 2], loss_mask=[0, 1],
                            logprobs=[0.0, -1.0]) for i in range(3)]
    lost = Trajectory(episode_id="g-3", group_id="g", status=STATUS_INFRA_ERROR, error="replica lost")
    other = [Trajectory(episode_id=f"h-{i}", group_id="h", reward=float(i), token_ids=[1, 2], loss_mask=[0, 1],
                        logprobs=[0.0, -1.0]) for i in range(2)]
    kept, advantages = train_samples([*survivors, lost, *other], Config)
    assert {s.group_id for s in kept} == {"h"}  # before: g's three survivors were normalised among themselves
    metrics = round_metrics([*survivors, lost, *other], len(kept), advantages, 1.0, 1.0, {})
    assert metrics["rollout/groups_dropped_lost"] == 1.0 and metrics["rollout/infra_failures"] == 1.0
    assert metrics["rollout/refills"] == 0.0


async def test_refill_replays_the_lost_episode_and_the_group_trains_as_if_nothing_was_lost():
    clean = await play([request()], Factory())
    refilled = await play([request()], Factory(answer(clean, "g3-1"), times=1), LostEpisodes("refill", max_refills=2))
    assert len(clean) == 4 and len(refilled) == 5
    failed = [t for t in refilled if t.status == STATUS_INFRA_ERROR]
    assert len(failed) == 1 and failed[0].episode_id == "g3-1/lost1" and failed[0].metrics[REFILLED] == 1.0
    assert not lost_for_good(failed[0])
    final = {t.episode_id: t for t in refilled if t.ok}
    assert {t.episode_id: (t.token_ids, t.reward) for t in clean} == {k: (t.token_ids, t.reward)
                                                                        for k, t in final.items()}
    assert advantages_by_episode(refilled) == advantages_by_episode(clean)
    kept, advantages = train_samples(refilled, Config)
    metrics = round_metrics(refilled, len(kept), advantages, 1.0, 1.0, {})
    assert metrics["rollout/refills"] == 1.0 and metrics["rollout/groups_dropped_lost"] == 0.0
    assert metrics["rollout/infra_failures"] == 1.0 and metrics["rollout/episodes"] == 5.0
    assert not any("lost_attempt" in key for key in metrics)  # the mark is not averaged as an env metric


async def test_drop_drops_the_group_whole_and_refills_are_bounded():
    clean = await play([request(), request(task=4)], Factory())
    dropped = await play([request(), request(task=4)], Factory(answer(clean, "g3-1"), times=1), LostEpisodes("drop"))
    assert len(dropped) == 8 and {t.group_id for t in dropped if lost_for_good(t)} == {"g3"}
    assert set(advantages_by_episode(dropped)) == {f"g4-{i}" for i in range(4)}
    # Refills spent: the first attempt and both refills of episode 1 are lost, so the group is dropped.
    exhausted = await play([request()], Factory(answer(clean, "g3-1"), times=3), LostEpisodes("refill", max_refills=2))
    assert [t.episode_id for t in exhausted if t.status == STATUS_INFRA_ERROR] == ["g3-1/lost1", "g3-1/lost2", "g3-1"]
    assert advantages_by_episode(exhausted) == {}
    sampler = RoundSampler(SequentialTasks(), groups_per_step=1, group_size=4, success_threshold=1.0)
    assert not sampler.trainable(exhausted)
    kept, advantages = train_samples(exhausted, Config)
    metrics = round_metrics(exhausted, len(kept), advantages, 1.0, 1.0, {})
    assert metrics["rollout/refills"] == 2.0 and metrics["rollout/groups_dropped_lost"] == 1.0


def test_the_config_chooses_refill_by_default_and_stays_strict():
    config = load_grpo_config(None, [])
    assert config.rollout.lost_episodes == "refill" and config.rollout.max_refills == 2
    assert config.rollout.lost_episodes_policy() == LostEpisodes("refill", 2)
    assert load_grpo_config(None, ["rollout.lost_episodes=drop"]).rollout.lost_episodes_policy().budget().left == 0
    with pytest.raises(ConfigError, match=r"rollout.lost_episodes: 'refil' is not one of \['refill', 'drop'\]"):
        load_grpo_config(None, ["rollout.lost_episodes=refil"])
    with pytest.raises(ConfigError, match=r"did you mean \['lost_episodes'\]"):
        load_grpo_config(None, ["rollout.lost_episode=drop"])
    with pytest.raises(ConfigError, match="max_refills must be >= 0"):
        load_grpo_config(None, ["rollout.max_refills=-1"])
