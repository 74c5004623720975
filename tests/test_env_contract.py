"""The TextEnv contract, shown on the guessing environment."""

import asyncio
import json

import gymnasium
import pytest

import forge_env
from forge_env import EpisodeEndedError, ResetNeededError, TaskError, check_env
from forge_env.tools import format_hermes_call
from forge_env.types import make_tool_call
from tests.guess_env import GuessEnv


def call(name, **arguments):
    return format_hermes_call(name, arguments)


async def test_reset_returns_opening_messages_and_tool_specs():
    env = GuessEnv()
    observation, info = await env.areset(seed=3)
    assert [m["role"] for m in observation] == ["system", "user"]
    names = [spec["function"]["name"] for spec in info["tools"]]
    assert names == ["hint", "explode", "crash", "nap", "shout"]
    hint = info["tools"][0]["function"]
    assert hint["parameters"]["properties"]["guess"] == {"type": "integer", "description": "the number to compare."}
    assert json.loads(json.dumps(info)) == info


async def test_same_seed_same_task_and_options_task_is_used_exactly():
    a, b = GuessEnv(), GuessEnv()
    await a.areset(seed=11)
    await b.areset(seed=11)
    assert a.state.task == b.state.task
    task = {"question": "Guess!", "answer": "42"}
    observation, _ = await a.areset(options={"task": task})
    assert observation[-1]["content"] == "Guess!"
    _, reward, terminated, truncated, _ = await a.astep("It is 42")
    assert (reward, terminated, truncated) == (1.0, True, False)


async def test_tool_call_then_final_answer():
    env = GuessEnv()
    await env.areset(options={"task": {"question": "q", "answer": "30"}})
    obs, reward, terminated, truncated, info = await env.astep(call("hint", guess=10))
    assert obs == [{"role": "tool", "content": "higher", "tool_call_id": obs[0]["tool_call_id"], "name": "hint"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_calls"] == 1 and "errors" not in info
    obs, reward, terminated, truncated, info = await env.astep({"role": "assistant", "content": "The number is 30"})
    assert obs == [] and reward == 1.0 and terminated and not truncated
    assert info["metrics"] == {"correct": 1.0, "polite": 0.0}
    assert info["episode_summary"]["turns"] == 2


async def test_wrong_final_answer_scores_zero_and_ends():
    env = GuessEnv()
    await env.areset(options={"task": {"question": "q", "answer": "30"}})
    _, reward, terminated, _, _ = await env.astep("31")
    assert reward == 0.0 and terminated


async def test_message_action_with_structured_tool_calls():
    env = GuessEnv()
    await env.areset(options={"task": {"question": "q", "answer": "5"}})
    action = {"role": "assistant", "content": "", "tool_calls": [make_tool_call("hint", {"guess": 5}, "call_a")]}
    obs, *_ = await env.astep(action)
    assert obs[0]["content"] == "correct" and obs[0]["tool_call_id"] == "call_a"


@pytest.mark.parametrize(
    "action, expected",
    [
        (call("explode", reason="why"), "Error: exploded: why"),
        (call("crash"), "Error: tool crash raised ZeroDivisionError"),
        (call("nap", seconds=5), "Error: tool nap timed out after 0.2 s"),
        (call("missing"), "Error: unknown tool 'missing'. Available tools: crash, explode, hint, nap, shout"),
        (call("hint", guess="ten"), "Error: hint.guess: expected integer, got str 'ten'"),
        (call("hint"), "Error: hint: missing required argument(s) ['guess']"),
        (call("hint", guess=1, extra=2), "Error: hint: unknown argument(s) ['extra']"),
    ],
)
async def test_tool_errors_become_tool_messages(action, expected):
    env = GuessEnv(invalid_action_penalty=0.5)
    await env.areset(seed=0)
    obs, reward, terminated, truncated, info = await env.astep(action)
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith(expected)
    assert reward == -0.5 and info["penalty"] == 0.5 and info["tool_errors"] == 1
    assert not terminated and not truncated


@pytest.mark.parametrize(
    "action, expected",
    [
        ("", "your message was empty"),
        ("<tool_call>{oops</tool_call>", "tool call 1 is not valid JSON"),
        ('<tool_call>{"name": "hint", "arguments": [1]}</tool_call>', "'arguments' must be a JSON object"),
        ("x" * 20_000, "your message is 20000 characters; the limit is 16000"),
        ({"role": "user", "content": "hi"}, "the role must be 'assistant'"),
        ({"role": "assistant", "content": 7}, "message content must be a string"),
        (["not", "a", "message"], "a message must be a dict"),
    ],
)
async def test_bad_actions_get_error_observations(action, expected):
    env = GuessEnv()
    await env.areset(seed=0)
    obs, reward, terminated, truncated, info = await env.astep(action)
    assert obs[0]["role"] == "user" and expected in obs[0]["content"]
    assert expected in " ".join(info["errors"])
    assert not terminated and not truncated and reward == 0.0


async def test_several_calls_are_answered_in_call_order():
    env = GuessEnv()
    await env.areset(options={"task": {"question": "q", "answer": "50"}})
    action = call("nap", seconds=0.05) + call("hint", guess=60) + call("nap", seconds=0) + call("shout", text="a")
    obs, *_ = await env.astep(action)
    assert [m["name"] for m in obs] == ["nap", "hint", "nap", "shout"]
    assert [m["content"] for m in obs] == ["awake", "lower", "awake", "A"]
    # Concurrency itself is shown without clocks in tests/test_tool_env.py (two tools that wait for each other).


async def test_sequential_tool_calls_when_parallel_disabled():
    env = GuessEnv(parallel_tool_calls=False)
    await env.areset(options={"task": {"question": "q", "answer": "50"}})
    obs, *_ = await env.astep(call("hint", guess=10) + call("hint", guess=90))
    assert [m["content"] for m in obs] == ["higher", "lower"]


async def test_tool_output_truncated_with_marker():
    env = GuessEnv()
    await env.areset(seed=0)
    obs, *_ = await env.astep(call("shout", text="abc", times=30))
    assert obs[0]["content"] == "ABC" * 16 + "AB" + "\n[... output truncated: 40 more characters]"


async def test_tool_call_budget_per_episode():
    env = GuessEnv(max_tool_calls=2)
    await env.areset(options={"task": {"question": "q", "answer": "50"}})
    obs, *_ = await env.astep(call("hint", guess=1) + call("hint", guess=2) + call("hint", guess=3))
    assert [m["content"] for m in obs[:2]] == ["higher", "higher"]
    assert "budget of 2 calls" in obs[2]["content"]


async def test_max_turns_truncates_and_step_after_end_raises():
    env = GuessEnv(max_turns=2)
    await env.areset(seed=1)
    *_, terminated, truncated, info = await env.astep(call("hint", guess=1))
    assert not truncated
    *_, terminated, truncated, info = await env.astep(call("hint", guess=2))
    assert truncated and not terminated and info["truncation_reason"] == "max_turns"
    with pytest.raises(EpisodeEndedError):
        await env.astep("50")


async def test_character_and_token_budgets_truncate():
    env = GuessEnv(max_episode_chars=120)
    await env.areset(seed=1)
    *_, truncated, info = await env.astep("thinking... " * 10 + call("hint", guess=1))
    assert truncated and info["truncation_reason"] == "max_chars"
    env = GuessEnv(max_episode_tokens=20, token_counter=lambda text: len(text.split()))
    await env.areset(seed=1)
    *_, truncated, info = await env.astep("a b c d e f g h i j k l " + call("hint", guess=1))
    assert truncated and info["truncation_reason"] == "max_tokens"
    with pytest.raises(ValueError, match="token_counter"):
        GuessEnv(max_episode_tokens=5)


async def test_step_before_reset_raises_and_bad_task_is_rejected():
    env = GuessEnv()
    with pytest.raises(ResetNeededError):
        await env.astep("1")
    with pytest.raises(TaskError):
        await env.areset(options={"task": ["not", "a", "dict"]})
    with pytest.raises(TaskError, match="no 'prompt' or 'question'"):
        await env.areset(options={"task": {"answer": "1"}})


def test_sync_api_matches_gymnasium_and_works_inside_a_running_loop():
    env = GuessEnv()
    observation, info = env.reset(seed=5)
    assert env.observation_space.contains(observation)
    assert env.action_space.contains("42") and not env.action_space.contains({"role": "user", "content": "x"})
    result = env.step(call("hint", guess=50))
    assert len(result) == 5

    async def inside_loop():
        return env.step("50")

    _, _, terminated, _, _ = asyncio.run(inside_loop())
    assert terminated
    env.close()


def test_gymnasium_make_builds_a_registered_env():
    forge_env.register("tests/GuessGym-v0", "tests.guess_env:GuessEnv", high=10)
    env = gymnasium.make("tests/GuessGym-v0")
    observation, info = env.reset(seed=0)
    assert "1 to 10" in observation[-1]["content"]
    assert forge_env.make("tests/GuessGym-v0", high=7).high == 7


def test_guess_env_passes_check_env():
    check_env(lambda: GuessEnv())
    check_env(GuessEnv(high=50))


def test_render_ansi():
    env = GuessEnv(render_mode="ansi")
    env.reset(seed=0)
    assert env.render().startswith("[system] Find the secret number")
