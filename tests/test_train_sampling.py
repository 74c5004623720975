"""Dynamic sampling (DAPO) and the task-sampler (curriculum) hook of ``agents.train.sampling``.

The rounds here are played by a small in-process "world" in which a task's outcome is a fixed function
of its env seed (solved by every episode, by none, or by some), so each expected count follows from the
seeds alone; the loop-level run with both options is in ``test_train_loop.py``.
"""

from __future__ import annotations

import collections

import pytest

from agents.groups import GroupRequest
from agents.train.checkpoint import LoopState
from agents.train.config import load_grpo_config
from agents.train.sampling import (
    PassRateCurriculum,
    RoundSampler,
    SequentialTasks,
    TaskSampler,
    build_task_sampler,
)
from agents.trajectory import Trajectory
from forge_env.config import ConfigError


def outcome(seed: int) -> list[float]:
    """Rewards of a 4-episode group on ``seed``: seeds = 0 mod 3 all fail, 1 mod 3 all pass, 2 mod 3 mixed."""
    return {0: [0.0] * 4, 1: [1.0] * 4, 2: [1.0, 0.0, 1.0, 0.0]}[seed % 3]


class World:
    """Plays requested groups: one trajectory per episode, rewards from ``outcome``; records what it played."""

    def __init__(self) -> None:
        self.requests: list[list[GroupRequest]] = []

    def __call__(self, requests: list[GroupRequest]):
        self.requests.append(list(requests))

        async def groups():
            for r in requests:
                yield [Trajectory(episode_id=f"{r.group_id}-{i}", group_id=r.group_id, seed=r.seed, reward=reward,
                                  token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0])
                       for i, reward in enumerate(outcome(r.seed)[: r.n])]

        return groups()


def sampler(tasks=None, *, dynamic=False, max_rounds=1, groups=3) -> RoundSampler:
    return RoundSampler(tasks or SequentialTasks(seed_start=0), groups_per_step=groups, group_size=4,
                        success_threshold=1.0, dynamic=dynamic, max_rounds=max_rounds)


async def test_without_dynamic_sampling_a_round_plays_groups_per_step_groups_as_before():
    state, world = LoopState(rounds=2, next_task=5), World()
    played = await sampler().play(state, world)
    assert [(r.seed, r.group_id) for r in world.requests[0]] == [(5, "r2-t5"), (6, "r2-t6"), (7, "r2-t7")]
    assert len(world.requests) == 1 and state.next_task == 8 and len(played.trajectories) == 12
    # Seeds 5 (mixed) is kept; 6 (all fail) and 7 (all pass) have no reward variance.
    assert played.metrics["rollout/dynamic/groups_kept"] == 1
    assert played.metrics["rollout/dynamic/groups_dropped"] == 2
    assert played.metrics["rollout/dynamic/target_met"] == 0


async def test_dynamic_sampling_tops_the_round_up_until_the_target_is_met():
    state, world = LoopState(next_task=0), World()
    played = await sampler(dynamic=True, max_rounds=10).play(state, world)
    # One group in three varies: seeds 2, 5, 8 are the three wanted. First pass 0..2 keeps one (rate 1/3),
    # so the next asks for 2 / (1/3) = 6 groups: 3..8, which hold 5 and 8.
    assert [[r.seed for r in p] for p in world.requests] == [[0, 1, 2], [3, 4, 5, 6, 7, 8]]
    m = played.metrics
    assert (m["rollout/dynamic/groups_kept"], m["rollout/dynamic/groups_dropped"]) == (3, 6)
    assert m["rollout/dynamic/groups_played"] == 9 and m["rollout/dynamic/passes"] == 2
    assert m["rollout/dynamic/target_met"] == 1 and state.next_task == 9
    assert len({t.group_id for t in played.trajectories}) == 9  # every group its own id


async def test_dynamic_sampling_stops_at_its_bound():
    state, world = LoopState(next_task=0), World()
    played = await sampler(dynamic=True, max_rounds=2, groups=3).play(state, world)
    assert sum(len(p) for p in world.requests) == 6  # 2 x groups_per_step, though only 2 groups varied
    assert played.metrics["rollout/dynamic/groups_kept"] == 2
    assert played.metrics["rollout/dynamic/target_met"] == 0
    assert state.next_task == 6


async def test_a_round_without_any_signal_still_ends():
    """Every task all-fail: the bound ends the round, and the loop's fruitless-round check takes over."""
    tasks = SequentialTasks(seed_start=0)
    tasks.choose = lambda i: 3 * i  # type: ignore[method-assign]  # seeds 0, 3, 6, ...: all fail
    played = await sampler(tasks, dynamic=True, max_rounds=3).play(LoopState(), World())
    assert played.metrics["rollout/dynamic/groups_played"] == 9 and played.metrics["rollout/dynamic/groups_kept"] == 0


def test_the_pass_rate_curriculum_prefers_tasks_solved_about_half_the_time():
    cur = PassRateCurriculum(seed_start=10, seed=1, pool_size=3, window=4, min_weight=0.02)
    cur.observe(10, [1.0] * 4, [True] * 4)  # always solved
    cur.observe(11, [0.0] * 4, [False] * 4)  # never
    cur.observe(12, [1, 0, 1, 0], [True, False, True, False])  # half
    assert [cur.pass_rate(s) for s in (10, 11, 12)] == [1.0, 0.0, 0.5]
    assert cur.weight(12) == pytest.approx(0.27) and cur.weight(10) == pytest.approx(0.02)
    counts = collections.Counter(cur.choose(i) for i in range(3000))
    # Expected shares 0.02 / 0.31, 0.02 / 0.31, 0.27 / 0.31 (about 194, 194, 2613 of 3000).
    assert counts[12] > 2400 and 100 < counts[10] < 300 and 100 < counts[11] < 300
    # The window forgets: four passes on the never-solved seed make it "always solved".
    cur.observe(11, [1.0] * 4, [True] * 4)
    assert cur.pass_rate(11) == 1.0
    assert [cur.choose(i) for i in range(20)] == [cur.choose(i) for i in range(20)]  # deterministic


def test_the_curriculum_state_survives_a_checkpoint():
    a = PassRateCurriculum(seed_start=0, seed=3, pool_size=8, window=3)
    a.observe(2, [1, 1, 0, 0], [True, True, False, False])
    a.observe(5, [0.0], [False])
    b = PassRateCurriculum(seed_start=0, seed=3, pool_size=8, window=3)
    import json

    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [b.pass_rate(s) for s in range(8)] == [a.pass_rate(s) for s in range(8)]
    assert [b.choose(i) for i in range(50)] == [a.choose(i) for i in range(50)]


async def test_the_round_sampler_feeds_the_curriculum_and_keeps_its_state_in_the_loop_state():
    cur = PassRateCurriculum(seed_start=0, seed=0, pool_size=9, window=8)
    rounds = sampler(cur, groups=3)
    state = LoopState()
    for _ in range(30):
        await rounds.play(state, World())
        state.rounds += 1
    assert state.next_task == 90 and state.tasks == cur.state_dict()
    for seed in range(9):  # what was seen matches the world: 0 mod 3 never passes, 1 mod 3 always, 2 half
        if cur.pass_rate(seed) is not None:
            assert cur.pass_rate(seed) == {0: 0.0, 1: 1.0, 2: 0.5}[seed % 3]
    # A new sampler (a resumed run) picks the history up from the loop state on its first round.
    resumed = PassRateCurriculum(seed_start=0, seed=0, pool_size=9, window=8)
    await sampler(resumed, groups=1).play(state, World())
    assert cur.history and all(resumed.pass_rate(s) is not None for s in cur.history)
    fresh = PassRateCurriculum(seed_start=0, seed=0, pool_size=9, window=8)
    await sampler(fresh, groups=1).play(LoopState(), World())  # no history to pick up
    assert sum(len(h) for h in fresh.history.values()) == 4


async def test_the_curriculum_then_plays_mostly_informative_tasks():
    cur = PassRateCurriculum(seed_start=0, seed=0, pool_size=30, window=8, min_weight=0.01)
    rounds = sampler(cur, groups=5)
    state = LoopState()
    for _ in range(20):
        await rounds.play(state, World())
        state.rounds += 1
    late = World()
    for _ in range(10):
        await rounds.play(state, late)
    seeds = [r.seed for p in late.requests for r in p]
    assert sum(s % 3 == 2 for s in seeds) / len(seeds) > 0.8  # a third of the pool, most of the draws


def test_task_samplers_are_built_by_name_or_import_path():
    assert isinstance(build_task_sampler("sequential", {}, seed_start=4, seed=0), SequentialTasks)
    custom = build_task_sampler("agents.train.sampling:PassRateCurriculum", {"pool_size": 5}, seed_start=0, seed=0)
    assert isinstance(custom, TaskSampler) and custom.pool_size == 5
    with pytest.raises(ValueError, match="unknown task sampler 'hardest'"):
        build_task_sampler("hardest", {}, seed_start=0, seed=0)
    with pytest.raises(ValueError, match="cannot be imported"):
        build_task_sampler("agents.train.sampling:Nope", {}, seed_start=0, seed=0)
    with pytest.raises(TypeError, match="lacks"):
        build_task_sampler("collections:OrderedDict", {}, seed_start=0, seed=0)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.dynamic_sampling.enabled=true", "advantages.drop_zero_variance=false"], r"drop_zero_variance=true"),
    (["rollout.dynamic_sampling.max_rounds=0"], r"max_rounds must be >= 1"),
    (["rollout.dynamic_sampling.max_round=3"], r"unknown key 'rollout.dynamic_sampling.max_round'.*max_rounds"),
    (["rollout.curriculum.sampler=hardest"], r"rollout.curriculum: unknown task sampler"),
    (["rollout.curriculum.sampler=pass_rate", "rollout.curriculum.kwargs.pool=3"], r"rollout.curriculum: .*pool"),
    (["rollout.curriculum.sampler=pass_rate", "rollout.curriculum.kwargs.min_weight=0"], r"min_weight must be > 0"),
])
def test_config_mistakes_are_reported(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_grpo_config(None, overrides)


def test_config_builds_the_round_sampler():
    config = load_grpo_config(None, ["rollout.dynamic_sampling.enabled=true", "rollout.dynamic_sampling.max_rounds=3",
                                     "rollout.curriculum.sampler=pass_rate", "rollout.curriculum.kwargs.pool_size=7",
                                     "env.seed_start=100"])
    rounds = RoundSampler.from_config(config)
    assert rounds.dynamic and rounds.max_rounds == 3
    assert isinstance(rounds.tasks, PassRateCurriculum) and rounds.tasks.pool_size == 7
    assert 100 <= rounds.tasks.choose(0) < 107
