"""Durable episodes: a snapshot after any completed turn, restored in a fresh env (here or on another replica),
finishes the episode exactly as an uninterrupted run does; envs that cannot snapshot say so and keep today's rule.

A deterministic scripted policy (each env's expert) plays; the interrupted run must match the uninterrupted one
in every observation, reward, flag and info (less the ``resumed`` record of the step that was resumed).
"""

import asyncio
import json
import os
import random
import signal

import pytest

import forge_env
from forge_env import InfraError, SnapshotError, TextEnv
from forge_env.core.snapshots import merge_snapshot
from forge_env.services import EnvService, SessionLostError
from forge_env.tools import format_hermes_call
from tests.guess_env import GuessEnv

forge_env.register("tests/Tally-v0", "tests.tally_env:TallyEnv")

ENVS = [("forge_env/Arithmetic-v0", {}), ("forge_env/ToolUse-v0", {"hops": 2}),
        ("forge_env/Math-v0", {"max_attempts": 2}), ("forge_env/Coding-v0", {"max_attempts": 2})]
WRONG = {"forge_env/Math-v0": "The answer is \\boxed{-1}.", "forge_env/Coding-v0": "```python\nprint(0)\n```"}


def policy_for(env_id):
    """The scripted policy: the env's expert, after a wrong answer where answers may be tried again (so the
    episode has several turns)."""
    def policy(env: TextEnv):
        return WRONG[env_id] if env_id in WRONG and env.state.turn == 0 else env.expert_action()
    return policy


async def uninterrupted(env_id, kwargs, seed):
    """(reset result, [(action, step result)]) of a whole episode with the scripted policy."""
    env = forge_env.make(env_id, **kwargs)
    reset = await env.areset(seed=seed)
    steps, policy = [], policy_for(env_id)
    while True:
        action = policy(env)
        result = await env.astep(action)
        steps.append((action, result))
        if result[2] or result[3]:
            return reset, steps


def without_resume(result):
    observation, reward, terminated, truncated, info = result
    return observation, reward, terminated, truncated, {k: v for k, v in info.items() if k != "resumed"}


@pytest.mark.parametrize(("env_id", "kwargs"), ENVS)
async def test_restoring_any_turns_snapshot_in_a_fresh_env_finishes_the_same_episode(env_id, kwargs):
    reset, steps = await uninterrupted(env_id, kwargs, seed=3)
    assert len(steps) >= 2 and steps[-1][1][1] > 0  # the scripted policy wins, over several turns
    for cut in range(len(steps)):  # snapshot after `cut` completed turns, go on in another instance
        first = forge_env.make(env_id, **kwargs)
        assert await first.areset(seed=3) == reset
        for action, expected in steps[:cut]:
            assert await first.astep(action) == expected
        snapshot = json.loads(json.dumps(first.snapshot()))  # plain JSON, as it travels
        second = forge_env.make(env_id, **kwargs)
        await second.arestore(snapshot)
        for action, expected in steps[cut:]:
            assert await second.astep(action) == expected
        assert second.state.done and second.state.turn == len(steps)


async def test_snapshot_deltas_merge_into_the_full_snapshot():
    env = forge_env.make("forge_env/ToolUse-v0", hops=2)
    await env.areset(seed=1)
    held = env.snapshot()
    for _ in range(2):
        shipped = len(held["state"]["messages"])
        await env.astep(env.expert_action())
        delta = env.snapshot(messages_from=shipped)
        assert "task" not in delta["state"] and len(delta["state"]["messages"]) < len(env.state.messages)
        held = merge_snapshot(held, delta)
        assert held == env.snapshot()
    with pytest.raises(SnapshotError, match="merge_snapshot"):
        await forge_env.make("forge_env/ToolUse-v0").arestore(delta)


async def test_envs_that_cannot_snapshot_say_so():
    guess = GuessEnv(high=16)  # keeps its secret on the instance: not plain episode state
    await guess.areset(seed=0)
    with pytest.raises(SnapshotError, match="does not support snapshots"):
        guess.snapshot()
    python_tool = forge_env.make("forge_env/ToolUse-v0", python=True)  # an interpreter per episode
    assert not python_tool.supports_snapshots and forge_env.make("forge_env/ToolUse-v0").supports_snapshots
    arithmetic = forge_env.make("forge_env/Arithmetic-v0")
    await arithmetic.areset(seed=0)
    with pytest.raises(SnapshotError, match="cannot be restored into"):
        await forge_env.make("forge_env/Math-v0").arestore(arithmetic.snapshot())
    arithmetic.state.data["handle"] = object()
    with pytest.raises(SnapshotError, match="not JSON-serialisable"):
        arithmetic.snapshot()


@pytest.mark.parametrize("backend", ["local", "monarch"])
async def test_a_durable_session_returns_what_a_local_env_returns(backend):
    """The snapshots riding along change nothing a caller sees; the client's held snapshot is the replica's."""
    reset, steps = await uninterrupted("forge_env/Coding-v0", {"max_attempts": 2}, seed=2)
    async with await EnvService.launch("forge_env/Coding-v0", backend=backend,
                                       env_kwargs={"max_attempts": 2}) as envs:
        async with envs.env() as remote:
            assert await remote.areset(seed=2) == reset
            for action, expected in steps[:-1]:
                assert await remote.astep(action) == expected
            twin = forge_env.make("forge_env/Coding-v0", max_attempts=2)
            await twin.arestore(remote.held_snapshot)
            assert await twin.astep(steps[-1][0]) == await remote.astep(steps[-1][0]) == steps[-1][1]


async def test_a_killed_replica_s_episode_resumes_on_another_with_the_same_trajectory():
    """Real replica processes: the one holding the episode is killed after turn 1 and again after turn 2 (the
    second kill hits the replica the episode was resumed on); the episode ends as the uninterrupted one does."""
    env_id, kwargs = "forge_env/ToolUse-v0", {"hops": 2}
    reset, steps = await uninterrupted(env_id, kwargs, seed=5)
    assert len(steps) >= 4
    async with await EnvService.launch(env_id, num_replicas=2, env_kwargs=kwargs) as envs:
        remote = envs.env()
        assert await remote.areset(seed=5) == reset
        resumes = []
        for turn, (action, expected) in enumerate(steps):
            if turn in (1, 2):
                pids = {stats["pid"] for stats in await envs.replica_stats() if isinstance(stats, dict)}
                victim = (await envs.replica_stats())[remote.replica]["pid"]
                assert victim in pids
                os.kill(victim, signal.SIGKILL)
            result = await remote.astep(action)
            if "resumed" in result[-1]:
                resumes.append((turn, result[-1]["resumed"]))
            assert without_resume(result) == expected
        assert [(turn, record["from_turn"]) for turn, record in resumes] == [(1, 1), (2, 2)]
        assert all("failed" in record["reason"] or "lost" in record["reason"] for _, record in resumes)
        metrics = envs.metrics()
        assert metrics.sessions_resumed == 2 and metrics.sessions_lost == 2
        await remote.aclose()


async def test_replicas_killed_at_random_turns_across_episodes_change_no_trajectory():
    """Fault injection: 8 ToolUse-v0 episodes in lockstep over 2 replicas; at two turns drawn from a seeded RNG
    the replica of a random episode is killed while that turn's steps are in flight. Every episode ends as its
    uninterrupted run does; every resume is counted."""
    env_id, kwargs, seeds = "forge_env/ToolUse-v0", {"hops": 2}, range(10, 18)
    runs = {seed: await uninterrupted(env_id, kwargs, seed) for seed in seeds}
    rng = random.Random(0)
    kill_turns = sorted(rng.sample(range(3), 2))
    async with await EnvService.launch(env_id, num_replicas=2, env_kwargs=kwargs) as envs:
        remotes = {seed: envs.env() for seed in seeds}
        for seed, remote in remotes.items():
            assert await remote.areset(seed=seed) == runs[seed][0]
        results = {seed: [] for seed in seeds}

        async def kill_one():
            await asyncio.sleep(rng.uniform(0, 0.002))
            victim = remotes[rng.choice(list(seeds))].replica
            stats = await envs.replica_stats()
            if victim is not None and isinstance(stats[victim], dict):
                os.kill(stats[victim]["pid"], signal.SIGKILL)

        for turn in range(max(len(steps) for _, steps in runs.values())):
            live = [seed for seed in seeds if turn < len(runs[seed][1])]
            jobs = [remotes[seed].astep(runs[seed][1][turn][0]) for seed in live]
            outcomes = await asyncio.gather(*jobs, *([kill_one()] if turn in kill_turns else []))
            for seed, result in zip(live, outcomes, strict=False):
                results[seed].append(result)
        resumes = 0
        for seed in seeds:
            assert [without_resume(r) for r in results[seed]] == [expected for _, expected in runs[seed][1]]
            resumes += sum("resumed" in r[-1] for r in results[seed])
        assert resumes >= 2 and envs.metrics().sessions_resumed == resumes
        for remote in remotes.values():
            await remote.aclose()


async def test_a_replica_killed_during_a_step_is_resumed_and_the_turn_counts_once():
    """The replica dies while a slow tool call runs: the turn is taken again on another replica, from the
    snapshot before it, so its effect (the tally) counts once, as in an uninterrupted episode."""
    actions = [format_hermes_call("add", {"n": 3}), format_hermes_call("add", {"n": 4}), "7"]
    async with await EnvService.launch("tests/Tally-v0", num_replicas=2, env_kwargs={"delay_s": 1.0}) as envs:
        remote = envs.env()
        await remote.areset(seed=0)
        assert (await remote.astep(actions[0]))[0][0]["content"] == "3"
        step = asyncio.ensure_future(remote.astep(actions[1]))
        await asyncio.sleep(0.4)  # the call is inside its 1 s tool
        os.kill((await envs.replica_stats())[remote.replica]["pid"], signal.SIGKILL)
        observation, _, terminated, _, info = await step
        assert observation[0]["content"] == "7" and not terminated  # 3 + 4, not 3 + 4 + 4
        assert info["resumed"]["from_turn"] == 1 and info["turn"] == 2
        _, reward, terminated, _, info = await remote.astep(actions[2])
        assert terminated and reward == 1.0 and "resumed" not in info
        assert info["episode_summary"]["turns"] == 3 and info["episode_summary"]["tool_calls"] == 2
        assert envs.metrics().sessions_resumed == 1
        await remote.aclose()


async def test_an_episode_ended_by_an_infra_error_is_never_revived():
    async with await EnvService.launch("tests/Tally-v0", num_replicas=2) as envs:
        remote = envs.env()
        await remote.areset(seed=0)
        await remote.astep(format_hermes_call("add", {"n": 3}))
        with pytest.raises(InfraError, match="broke"):
            await remote.astep(format_hermes_call("breakdown", {}))
        assert remote.held_snapshot is None
        os.kill((await envs.replica_stats())[remote.replica]["pid"], signal.SIGKILL)
        with pytest.raises(SessionLostError):
            await remote.astep("3")
        assert envs.metrics().sessions_resumed == 0


async def test_without_snapshots_a_lost_episode_is_lost_as_before():
    async with await EnvService.launch("forge_env/Arithmetic-v0", num_replicas=2, resume_sessions=False) as envs:
        remote = envs.env()
        await remote.areset(seed=0)
        os.kill((await envs.replica_stats())[remote.replica]["pid"], signal.SIGKILL)
        with pytest.raises(SessionLostError):
            await remote.astep("42")
        assert envs.metrics().sessions_resumed == 0
