"""ToolEnv: a tool environment from tools, a task source and a rubric, with TextEnv's tool-call rules."""

import asyncio
import json
import pathlib
import re

import pytest

from forge_env import Rubric, ToolEnv, ToolError, answer_matches, check_env, tool
from forge_env.tools import format_hermes_call
from forge_env.tools.calculator import calculator

PRICES = {"apple": 3, "pear": 5}


@tool
def price(item: str) -> str:
    """The price of an item in euros.

    Args:
        item: the item's name.
    """
    if item not in PRICES:
        raise ToolError(f"no item {item!r}; known: {sorted(PRICES)}")
    return str(PRICES[item])


def make_task(rng):
    item, count = str(rng.choice(list(PRICES))), int(rng.integers(2, 9))
    return {"question": f"What do {count} {item}s cost?", "answer": str(count * PRICES[item])}


def call(name, **arguments):
    return format_hermes_call(name, arguments)


def test_task_function_is_seeded_and_task_list_is_used():
    a, b = ToolEnv(tools=[price], tasks=make_task), ToolEnv(tools=[price], tasks=make_task)
    assert a.reset(seed=4)[0] == b.reset(seed=4)[0]
    assert {a.reset(seed=s)[0][-1]["content"] for s in range(20)} != {a.reset(seed=4)[0][-1]["content"]}
    listed = ToolEnv(tools=[price], tasks=[{"question": "Only one?", "answer": "1"}], system_prompt="Be brief.")
    observation, info = listed.reset(seed=0)
    assert observation == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Only one?"}]
    assert [t["function"]["name"] for t in info["tools"]] == ["price"]


async def test_solves_with_tools_and_reports_tool_metrics():
    env = ToolEnv(tools=[price, calculator], tasks=make_task)
    await env.areset(options={"task": {"question": "What do 4 pears cost?", "answer": "20"}})
    observation, reward, *_ = await env.astep(call("price", item="pear") + call("calculator", expression="4 * 5"))
    assert [m["content"] for m in observation] == ["5", "20"] and reward == 0.0
    await env.astep(call("price", item="plum"))
    observation, reward, terminated, truncated, info = await env.astep("Four pears cost 20 euros. Answer: 20")
    assert reward == 1.0 and terminated and not truncated
    assert info["metrics"] == {"answer_matches": 1.0, "tool_calls": 3.0, "tool_errors": 1.0, "turns": 3.0}


async def test_wrong_answer_scores_zero():
    env = ToolEnv(tools=[price], tasks=make_task)
    await env.areset(options={"task": {"question": "What do 4 pears cost?", "answer": "20"}})
    *_, reward, terminated, _, info = await env.astep("Answer: 21")
    assert reward == 0.0 and terminated and info["metrics"]["answer_matches"] == 0.0


async def test_custom_rubric_replaces_the_default():
    def says_euros(completion: str) -> float:
        return float("euro" in completion)

    env = ToolEnv(tools=[price], tasks=make_task, rubric=Rubric([says_euros]))
    await env.areset(seed=0)
    *_, reward, _, _, info = await env.astep("It costs many euros.")
    assert reward == 1.0 and set(info["metrics"]) == {"says_euros", "tool_calls", "tool_errors", "turns"}


async def test_parallel_calls_run_concurrently_and_answer_in_call_order():
    # Each tool waits for the other to start: this only completes when they run at the same time.
    started = {"first": asyncio.Event(), "second": asyncio.Event()}

    @tool
    async def meet(me: str, other: str) -> str:
        """Wait until the other caller has arrived."""
        started[me].set()
        await started[other].wait()
        return f"{me} met {other}"

    env = ToolEnv(tools=[meet, price], tasks=make_task, tool_timeout=5)
    await env.areset(seed=0)
    observation, *_ = await env.astep(
        call("meet", me="first", other="second") + call("price", item="apple") + call("meet", me="second", other="first"))
    assert [m["content"] for m in observation] == ["first met second", "3", "second met first"]
    assert [m["name"] for m in observation] == ["meet", "price", "meet"]
    assert len({m["tool_call_id"] for m in observation}) == 3


async def test_tool_timeout_is_reported_and_the_episode_goes_on():
    @tool
    async def hang() -> str:
        """Never answers."""
        await asyncio.Event().wait()
        return "unreachable"

    env = ToolEnv(tools=[hang, price], tasks=make_task, tool_timeout=0.1)
    await env.areset(seed=0)
    observation, _, terminated, truncated, info = await env.astep(call("hang") + call("price", item="pear"))
    assert observation[0]["content"] == "Error: tool hang timed out after 0.1 s"
    assert observation[1]["content"] == "5"
    assert info["tool_errors"] == 1 and not terminated and not truncated


async def test_long_tool_output_is_truncated_with_a_marker():
    @tool
    def dump(n: int) -> str:
        """Return n characters."""
        return "x" * n

    env = ToolEnv(tools=[dump], tasks=make_task, max_tool_output_chars=10)
    await env.areset(seed=0)
    observation, *_ = await env.astep(call("dump", n=25))
    assert observation[0]["content"] == "x" * 10 + "\n[... output truncated: 15 more characters]"


async def test_tool_call_cap_per_episode():
    env = ToolEnv(tools=[price], tasks=make_task, max_tool_calls=2)
    await env.areset(seed=0)
    observation, *_ = await env.astep(call("price", item="pear") + call("price", item="apple"))
    assert [m["content"] for m in observation] == ["5", "3"]
    observation, *_ = await env.astep(call("price", item="pear"))
    assert "budget of 2 calls" in observation[0]["content"]


def test_bad_tools_and_task_sources_are_rejected():
    with pytest.raises(TypeError, match="decorate functions with @tool"):
        ToolEnv(tools=[lambda: "x"], tasks=make_task)
    with pytest.raises(TypeError, match="list of task dicts or a function"):
        ToolEnv(tools=[price], tasks=42)


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("Answer: 20", "20", 1.0),
        ("It is 48,169 in total.", "48169", 1.0),
        ("3 apples, so Answer: 9.0", "9", 1.0),
        ("Answer: 21", "20", 0.0),
        ("Answer: 20 or 21", "20", 0.0),
        ("no number here", "20", 0.0),
        ("Answer: Paris.", "paris", 1.0),
        ("Answer: Lyon", "Paris", 0.0),
        ("Answer: 20", None, 0.0),
    ],
)
def test_answer_matches(completion, answer, expected):
    assert answer_matches(completion, answer) == expected


def test_check_env_passes():
    check_env(lambda: ToolEnv(tools=[price, calculator], tasks=make_task, max_turns=4))
    check_env(ToolEnv(tools=[price], tasks=[{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]))
    json.dumps(ToolEnv(tools=[price], tasks=make_task).reset(seed=1)[1])


def test_docs_write_an_environment_example_runs():
    text = (pathlib.Path(__file__).parent.parent / "docs" / "tool_use.md").read_text()
    block = re.search(r"## Write an environment\n.*?```python\n(.*?)```", text, re.S).group(1)
    assert len(block.splitlines()) <= 25
    exec(compile(block, "docs/tool_use.md", "exec"), {})
