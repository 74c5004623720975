"""EnvService / RemoteEnv: the same episodes as a local TextEnv, capacity, reaping, and real replicas."""

import asyncio
import os
import signal

import pytest

import forge_env
from forge_env import EpisodeEndedError, ResetNeededError, UnknownEnvironmentError
from forge_env.core.env import EnvError
from forge_env.services import EnvCapacityError, EnvService, ReplicaSpawnError, SessionLostError
from forge_env.tools import format_hermes_call
from forge_env.types import assistant_message, make_tool_call
from tests.guess_env import GuessEnv
from tests.waiting import wait_until

ENV_ID = "tests/Guess-v0"
forge_env.register(ENV_ID, "tests.guess_env:GuessEnv", high=16, max_turns=8)


async def play(env, seed):
    """Binary search with the hint tool, then answer. Returns (reward, turns)."""
    _, info = await env.areset(seed=seed)
    assert info["tools"][0]["function"]["name"] == "hint"
    low, high = 1, 16
    for _ in range(6):
        guess = (low + high) // 2
        observation, _, terminated, _, _ = await env.astep(format_hermes_call("hint", {"guess": guess}))
        assert not terminated
        verdict = observation[0]["content"]
        if verdict == "correct":
            break
        low, high = (guess + 1, high) if verdict == "higher" else (low, guess - 1)
    _, reward, terminated, truncated, info = await env.astep(f"please, it is {guess}")
    assert terminated and not truncated
    return reward, info["episode_summary"]["turns"]


async def test_remote_env_returns_what_a_local_env_returns():
    actions = [assistant_message(tool_calls=[make_tool_call("hint", {"guess": 8}, "c1")]),  # a message action
               "<tool_call>{not json</tool_call>",  # bad actions are answered with error observations
               assistant_message(tool_calls=[make_tool_call("explode", {}, "c2"), make_tool_call("nope", {}, "c3")]),
               "It is 8"]
    local = GuessEnv(high=16, max_turns=8)
    async with await EnvService.launch(ENV_ID, backend="local") as envs:
        remote = envs.env()
        assert await remote.areset(seed=5) == await local.areset(seed=5)
        infos = []
        for action in actions:
            result = await remote.astep(action)
            assert result == await local.astep(action)
            infos.append(result[-1])
        assert [bool(info.get("errors")) for info in infos] == [False, True, True, False]
        with pytest.raises(EpisodeEndedError):
            await remote.astep("again")
        assert envs.metrics().failures == 0 and envs.metrics().healthy_replicas == 1
        await remote.aclose()


async def test_misuse_and_unknown_ids_give_specific_errors():
    with pytest.raises(UnknownEnvironmentError, match="Guess-v0"):
        await EnvService.launch("tests/Guess-v9", backend="local")
    with pytest.raises(ReplicaSpawnError, match="unexpected keyword"):
        await EnvService.launch(ENV_ID, backend="local", env_kwargs={"colour": "red"})
    async with await EnvService.launch(ENV_ID, backend="local") as envs:
        env = envs.env()
        with pytest.raises(ResetNeededError):
            await env.astep("hello")
        await env.areset(seed=1)
        await env.aclose()
        with pytest.raises(EnvError, match="closed"):
            await env.areset(seed=1)
        other = envs.env()
        await other.areset(seed=2)
        assert envs.metrics().sessions == 1
        other.close()  # the sync close releases the episode on the running loop
        await asyncio.sleep(0.01)
        assert envs.metrics().sessions == 0


async def test_capacity_error_when_full_and_slots_come_back_on_close():
    async with await EnvService.launch(ENV_ID, backend="local", num_replicas=2, max_episodes_per_replica=2) as envs:
        open_envs = [envs.env() for _ in range(4)]
        for i, env in enumerate(open_envs):
            await env.areset(seed=i)
        assert sorted(env.replica for env in open_envs) == [0, 0, 1, 1]
        with pytest.raises(EnvCapacityError, match="4 open episodes.*max_episodes_per_replica=2"):
            await envs.env().areset(seed=9)
        await open_envs[0].aclose()
        extra = envs.env()
        await extra.areset(seed=9)
        stats = await envs.replica_stats()
        assert sum(s["open_episodes"] for s in stats) == 4


async def test_idle_episodes_are_reaped():
    async with await EnvService.launch(ENV_ID, backend="local", episode_idle_ttl_s=0.05) as envs:
        env = envs.env()
        await env.areset(seed=3)

        async def all_closed():
            [stats] = await envs.replica_stats()
            return stats["open_episodes"] == 0

        await wait_until(all_closed)
        with pytest.raises(SessionLostError, match="idle"):
            await env.astep("It is 3")
        await env.areset(seed=3)  # a new episode starts fine
        assert (await env.astep("It is 3"))[2] is True


async def test_200_concurrent_episodes_across_4_replicas():
    async with await EnvService.launch(ENV_ID, num_replicas=4, max_episodes_per_replica=64) as envs:
        async def episode(seed):
            async with envs.env() as env:
                return await play(env, seed)

        results = await asyncio.gather(*(episode(seed) for seed in range(200)))
        assert [reward for reward, _ in results] == [1.0] * 200
        stats = await envs.replica_stats()
        assert len({s["pid"] for s in stats}) == 4 and os.getpid() not in {s["pid"] for s in stats}
        assert sum(s["episodes_started"] for s in stats) == 200
        assert min(s["episodes_started"] for s in stats) >= 20  # every replica took a fair share
        assert sum(s["open_episodes"] for s in stats) == 0  # closed on context exit
        assert envs.metrics().failures == 0


async def test_killing_a_replica_loses_only_its_episodes():
    async with await EnvService.launch(ENV_ID, num_replicas=2) as envs:
        episodes = [envs.env() for _ in range(6)]
        for i, env in enumerate(episodes):
            await env.areset(seed=i)
        stats = await envs.replica_stats()
        victim = episodes[0].replica
        os.kill(stats[victim]["pid"], signal.SIGKILL)
        outcomes = []
        for env in episodes:
            try:
                await env.astep("It is 1")
                outcomes.append("ok")
            except SessionLostError:
                outcomes.append("lost")
        assert outcomes.count("lost") == 3 and outcomes[0] == "lost", outcomes
        for env in episodes:  # a lost episode's client starts over on a healthy replica
            await env.areset(seed=7)
            assert (await env.astep("It is 1"))[2] is True
