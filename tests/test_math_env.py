"""Math-v0: retries, the calculator, format checks, hung verifiers, the bundled GSM8K sample."""

from __future__ import annotations

import pytest

import forge_env
from environments.math.env import RETRY_MESSAGE, MathEnv
from environments.math.verify import VerifierPool
from forge_env import TaskError, check_env
from forge_env.tools import format_hermes_call

HALF = {"question": "What is one half as a decimal?", "answer": "0.5"}


def test_check_env_passes_for_math() -> None:
    check_env(lambda: forge_env.make("forge_env/Math-v0"))
    check_env(forge_env.make("forge_env/Math-v0", max_attempts=3, use_calculator=True))


async def test_equivalent_answer_scores_one_and_reports_metrics() -> None:
    env = MathEnv(tasks=[HALF])
    observation, info = await env.areset(seed=0)
    assert [m["role"] for m in observation] == ["system", "user"] and "\\boxed{}" in observation[0]["content"]
    assert info["tools"] == []
    _, reward, terminated, truncated, info = await env.astep("Half is $\\boxed{\\frac{1}{2}}$.")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["metrics"] == {"correct": 1.0, "format_ok": 1.0, "attempts": 1.0}


async def test_retries_get_feedback_and_later_success_earns_less() -> None:
    env = MathEnv(tasks=[HALF], max_attempts=3)
    await env.areset(seed=0)
    observation, reward, terminated, _, info = await env.astep("\\boxed{0.25}")
    assert observation == [{"role": "user", "content": RETRY_MESSAGE}]
    assert (reward, terminated, info["metrics"]["correct"]) == (0.0, False, 0.0)
    observation, reward, terminated, _, _ = await env.astep("I am not sure.")
    assert "\\boxed{}" in observation[0]["content"] and not terminated  # told how to format the answer
    _, reward, terminated, _, info = await env.astep("It is \\boxed{1/2}")
    assert terminated and reward == 0.25 and info["metrics"]["attempts"] == 3.0


async def test_attempts_run_out_and_custom_attempt_rewards() -> None:
    env = MathEnv(tasks=[HALF], max_attempts=2, attempt_rewards=[1.0, 0.8])
    await env.areset(seed=0)
    await env.astep("\\boxed{3}")
    observation, reward, terminated, truncated, info = await env.astep("\\boxed{4}")
    assert (observation, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["episode_summary"]["turns"] == 2
    await env.areset(seed=0)
    await env.astep("\\boxed{3}")
    assert (await env.astep("\\boxed{.5}"))[1] == 0.8
    with pytest.raises(ValueError, match="attempt_rewards needs 3 values"):
        MathEnv(tasks=[HALF], max_attempts=3, attempt_rewards=[1.0])


async def test_format_ok_follows_the_requested_format_and_can_carry_reward() -> None:
    env = MathEnv(tasks=[{"question": "q", "answer": "x\n#### 1,200"}], answer_format="gsm8k", format_reward=0.1)
    await env.areset(seed=0)
    _, reward, _, _, info = await env.astep("so 1200 in total\n#### 1200")
    assert info["metrics"]["format_ok"] == 1.0 and reward == pytest.approx(1.1)
    await env.areset(seed=0)
    _, reward, _, _, info = await env.astep("The total is \\boxed{1200}.")
    assert info["metrics"] == {"correct": 1.0, "format_ok": 0.0, "attempts": 1.0} and reward == 1.0


async def test_calculator_tool_in_math() -> None:
    env = MathEnv(tasks=[{"question": "What is 12*13?", "answer": "156"}], use_calculator=True)
    _, info = await env.areset(seed=0)
    assert [spec["function"]["name"] for spec in info["tools"]] == ["calculator"]
    observation, reward, terminated, _, _ = await env.astep(format_hermes_call("calculator", {"expression": "12*13"}))
    assert observation[0]["role"] == "tool" and observation[0]["content"] == "156" and not terminated
    observation, _, terminated, _, info = await env.astep(format_hermes_call("calculator", {"expression": "12*"}))
    assert observation[0]["content"].startswith("Error:") and not terminated and info["tool_errors"] == 1
    assert (await env.astep("\\boxed{156}"))[1] == 1.0


async def test_a_hanging_verification_is_killed_and_the_env_keeps_serving() -> None:
    with VerifierPool(num_workers=1, deadline_s=1.0) as pool:
        env = MathEnv(tasks=[{"question": "q", "answer": "1"}], verifier=pool)
        await env.areset(seed=0)
        _, reward, terminated, _, info = await env.astep("\\boxed{2^{2^{40}}}")
        assert (reward, terminated, info["metrics"]["correct"]) == (0.0, True, 0.0)
        assert env.state.data["verdict"]["status"] == "timeout"
        await env.areset(seed=0)
        assert (await env.astep("\\boxed{1}"))[1] == 1.0
        assert pool.stats["timeouts"] == 1


async def test_expert_solves_every_bundled_gsm8k_problem() -> None:
    env = MathEnv()
    assert len(env.tasks) == 200
    for task in env.tasks:
        await env.areset(options={"task": task})
        _, reward, terminated, _, _ = await env.astep(env.expert_action())
        assert reward == 1.0 and terminated, task


async def test_user_tasks_are_validated() -> None:
    env = MathEnv(tasks=[HALF])
    with pytest.raises(TaskError, match="needs"):
        await env.areset(options={"task": {"prompt": "no answer"}})
    await env.areset(options={"task": {"question": "Area?", "answer": 12}})
    assert (await env.astep("\\boxed{12}"))[1] == 1.0
    with pytest.raises(ValueError, match="answer_format"):
        MathEnv(tasks=[HALF], answer_format="latex")  # type: ignore[arg-type]


def test_sync_api_works_too() -> None:
    env = forge_env.make("forge_env/Math-v0", tasks=[HALF])
    env.reset(seed=1)
    assert env.step("The answer is 0.5")[1] == 1.0
