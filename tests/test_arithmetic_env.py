"""Arithmetic-v0: seeded tasks and splits, the calculator, expert actions and demonstrations."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import pytest

import forge_env
from environments.arithmetic.env import ArithmeticEnv, expert_demonstrations
from environments.arithmetic.tasks import SPLIT_SEED_RANGES, Difficulty, generate_task, split_of
from forge_env import check_env
from forge_env.tools import format_hermes_call
from forge_env.tools.calculator import CalculatorError, calculate, evaluate
from forge_env.types import validate_message


def test_check_env_passes_for_arithmetic() -> None:
    check_env(lambda: forge_env.make("forge_env/Arithmetic-v0"))
    check_env(forge_env.make("forge_env/Arithmetic-v0", split="test", operators="+-*/", digits=3))


@pytest.mark.parametrize(("expression", "value"), [
    ("23+45*2", "113"), ("(1+2)*3", "9"), ("-3-4", "-7"), ("7/2", "3.5"), ("1/3", "0.333333"),
    ("2^10", "1024"), ("2**-1", "0.5"), ("10//3", "3"), ("10%4", "2"), ("1,000+1", "1001"), ("6×7÷2", "21"),
])
def test_calculator_values(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(("expression", "reason"), [
    ("1/0", "division by zero"), ("9**9**9", "exponents"), ("2**0.5", "exponents"),
    ("__import__('os')", "only numbers"), ("x+1", "only numbers"), ("1+", "cannot parse"), ("", "give an expression"),
    ("9" * 70 + "*" + "9" * 70, "too large"), ("1+" * 150 + "1", "longer than"),
])
def test_calculator_refuses_with_a_reason(expression: str, reason: str) -> None:
    with pytest.raises(CalculatorError, match=reason):
        evaluate(expression)


def test_generation_is_seeded_and_respects_the_difficulty() -> None:
    difficulty = Difficulty.of(num_operands=(2, 4), digits=(1, 3), operators="+*")
    for seed in range(200):
        task = generate_task(seed, difficulty)
        assert task == generate_task(seed, difficulty)
        operands = re.split(r"[+*]", task["expression"])
        assert 2 <= len(operands) <= 4 and all(1 <= len(x) <= 3 for x in operands)
        assert set(re.sub(r"\d", "", task["expression"])) <= {"+", "*"}
        assert task["answer"] == calculate(task["expression"])
        assert task["question"] == f"What is {task['expression']}?"
    with pytest.raises(ValueError, match="operators"):
        Difficulty.of(2, 2, "+&")
    with pytest.raises(ValueError, match="num_operands"):
        Difficulty.of(1, 2, "+")


def test_held_out_splits_never_share_an_expression() -> None:
    easy = Difficulty.of(2, 1, "+-")
    train = {generate_task(s, easy, "train")["expression"] for s in range(0, 600)}
    test = {generate_task(s, easy, "test")["expression"] for s in SPLIT_SEED_RANGES["test"][:200]}
    assert train and test and not train & test
    assert {split_of(e) for e in train} == {"train"} and {split_of(e) for e in test} == {"test"}
    env = ArithmeticEnv(split="test")
    for seed in range(20):
        env.reset(seed=seed)
        assert env.state.task["task_seed"] in SPLIT_SEED_RANGES["test"]


def test_same_seed_same_episode_and_short_prompts() -> None:
    a, b = ArithmeticEnv(), ArithmeticEnv()
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    observation, _ = a.reset(seed=7)
    assert sum(len(m["content"]) for m in observation) < 80


async def test_expert_actions_from_observations_solve_episodes() -> None:
    env = ArithmeticEnv(num_operands=(2, 4), digits=(1, 3), operators="+-*/")
    for seed in range(30):
        observation, _ = await env.areset(seed=seed)
        call = env.expert_action(observation)
        validate_message(call)
        assert call["tool_calls"][0]["function"]["name"] == "calculator"
        observation, reward, terminated, _, _ = await env.astep(call)
        assert observation[0]["role"] == "tool" and not terminated and reward == 0.0
        answer = env.expert_action(observation)
        validate_message(answer)
        assert answer == {"role": "assistant", "content": env.state.task["answer"]}
        _, reward, terminated, _, info = await env.astep(answer)
        assert reward == 1.0 and terminated
        assert info["metrics"] == {"correct": 1.0, "format_ok": 1.0, "used_tool": 1.0}


async def test_expert_works_from_the_episode_state_and_after_an_error() -> None:
    env = ArithmeticEnv()
    await env.areset(seed=3)
    observation, *_ = await env.astep(format_hermes_call("calculator", {"expression": "2+"}))
    assert observation[0]["content"].startswith("Error:")
    call = env.expert_action(env.state)  # back to the right call
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"expression": env.state.task["expression"]}
    observation, *_ = await env.astep(call)
    assert (await env.astep(env.expert_action()))[1] == 1.0


async def test_raw_text_actions_and_scoring() -> None:
    env = ArithmeticEnv()
    await env.areset(options={"task": {"question": "What is 2+3?", "answer": 5}})
    observation, *_ = await env.astep(format_hermes_call("calculator", {"expression": "2+3"}))
    assert observation[0]["content"] == "5"
    _, reward, _, _, info = await env.astep("The answer is 5.")
    assert reward == 1.0 and info["metrics"]["format_ok"] == 0.0  # right, but not the bare number
    await env.areset(options={"task": {"question": "What is 2+3?", "answer": "5"}})
    _, reward, _, _, info = await env.astep("6")
    assert reward == 0.0 and info["metrics"] == {"correct": 0.0, "format_ok": 1.0, "used_tool": 0.0}
    with pytest.raises(forge_env.TaskError, match="must be a number"):
        await env.areset(options={"task": {"question": "What is 2+3?", "answer": "five"}})


def test_expert_demonstrations_for_sft() -> None:
    demos = expert_demonstrations(range(100, 110), digits=2)
    assert len(demos) == 10 and demos == expert_demonstrations((100, 110), digits=2)
    for demo in demos:
        assert [m["role"] for m in demo["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        assert demo["messages"][-1]["content"] == demo["task"]["answer"]
        assert Fraction(demo["messages"][3]["content"]) == Fraction(demo["task"]["answer"])
        assert demo["tools"][0]["function"]["name"] == "calculator"
        assert json.loads(json.dumps(demo)) == demo
    held_out = expert_demonstrations(range(5), split="test")
    assert all(split_of(d["task"]["expression"]) == "test" for d in held_out)
