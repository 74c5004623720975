"""TextEnv next to gymnasium's own machinery: standard wrappers, vector envs, forked and spawned workers.

These are what a gymnasium user reaches for first; each must work unchanged.
"""

from __future__ import annotations

import asyncio
import multiprocessing

import gymnasium
import pytest
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit
from gymnasium.wrappers.vector import RecordEpisodeStatistics as VectorRecordEpisodeStatistics

from forge_env.utils.aio import run_sync
from tests.guess_env import GuessEnv

FINAL = "my answer is 0"  # a final answer: ends the episode (reward 0, the secret is 1..100)
TOOL_TURN = '<tool_call>{"name": "hint", "arguments": {"guess": 50}}</tool_call>'


def test_record_episode_statistics_reports_the_finished_episode():
    env = RecordEpisodeStatistics(GuessEnv())
    env.reset(seed=0)
    env.step(TOOL_TURN)
    _, _, terminated, _, info = env.step(FINAL)
    assert terminated
    assert info["episode"]["l"] == 2  # gymnasium's own statistics, not ours
    assert info["episode_summary"]["turns"] == 2  # ours, under a key of our own
    env.close()


def test_time_limit_truncates_a_text_episode():
    env = TimeLimit(GuessEnv(), max_episode_steps=1)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(TOOL_TURN)
    assert truncated and not terminated
    env.close()


def test_sync_vector_env_with_vector_episode_statistics():
    envs = VectorRecordEpisodeStatistics(SyncVectorEnv([GuessEnv, GuessEnv]))
    envs.reset(seed=[0, 1])
    _, _, terminated, _, info = envs.step([FINAL, FINAL])
    assert list(terminated) == [True, True]
    assert list(info["episode"]["l"]) == [1, 1]
    envs.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_async_vector_env_in_forked_and_spawned_workers(context):
    if context not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    run_sync(asyncio.sleep(0))  # the parent's background loop exists before the workers fork
    envs = AsyncVectorEnv([GuessEnv, GuessEnv], context=context, shared_memory=False)
    try:
        envs.reset_async(seed=[0, 1])
        observations, _ = envs.reset_wait(timeout=120)  # hung forever after fork before the fix
        assert observations[0][-1]["role"] == "user"
        envs.step_async([TOOL_TURN, FINAL])
        _, _, terminated, _, info = envs.step_wait(timeout=120)
        assert list(terminated) == [False, True]
    finally:
        envs.close(terminate=True)


def test_make_vec_async_by_id():
    import forge_env

    forge_env.register("tests/GuessInterop-v0", GuessEnv)
    envs = gymnasium.make_vec("tests/GuessInterop-v0", num_envs=2, vectorization_mode="async",
                                vector_kwargs={"shared_memory": False})  # text is not a numpy array
    try:
        envs.reset_async(seed=0)
        observations, _ = envs.reset_wait(timeout=120)
        assert len(observations) == 2
    finally:
        envs.close(terminate=True)


def _registered_ids() -> list:
    """Every registered forge_env id, marked with what it needs to run here (issue 47)."""
    import forge_env
    from tests.docker_support import requires_docker
    from tests.sandbox_support import requires_bwrap

    forge_env.load_plugins()
    needs = {"forge_env/SWE-v0": [requires_bwrap], "forge_env/Terminal-v0": [pytest.mark.docker, requires_docker]}
    ids = sorted(i for i in gymnasium.registry if i.startswith("forge_env/"))
    assert {"forge_env/SWE-v0", "forge_env/Terminal-v0"} <= set(ids), ids
    return [pytest.param(i, marks=needs.get(i, []), id=i) for i in ids]


@pytest.mark.filterwarnings("ignore::UserWarning")  # gymnasium's notes on text spaces, not failures
@pytest.mark.parametrize("env_id", _registered_ids())
def test_gymnasium_check_env_passes_for_every_registered_id_made_without_arguments(env_id):
    """``gymnasium.make(id)`` needs no arguments (Terminal-v0 runs its bundled task), and gymnasium's own checker
    passes: a seed and the actions determine reset's and step's info (no durations in it)."""
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make(env_id)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()
