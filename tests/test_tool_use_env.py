"""ToolUse-v0: seeded knowledge-base questions, search/read/calculator tools, expert demonstrations."""

import asyncio
import json
import re

import gymnasium
import numpy as np
import pytest

import forge_env
from environments.tool_use.env import ToolUseEnv, expert_demonstrations, expert_turns
from environments.tool_use.knowledge import generate_task
from environments.tool_use.search import DocumentIndex
from forge_env import TaskError, check_env
from forge_env.core.demonstrations import ExpertFailedError, demonstrate
from forge_env.tools import format_hermes_call
from forge_env.types import assistant_message, make_tool_call


def call(name, **arguments):
    return format_hermes_call(name, arguments)


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
@pytest.mark.parametrize("distractors", [0, 8])
async def test_expert_solves_every_difficulty(hops, distractors):
    env = ToolUseEnv(hops=hops, distractors=distractors)
    for seed in range(6):
        messages = (await demonstrate(env, seed=seed))["messages"]
        task = env.state.task
        reads = [c for m in messages for c in m.get("tool_calls", []) if c["function"]["name"] == "read"]
        assert len(reads) == hops == task["hops"]
        assert len(task["documents"]) == hops + distractors
        assert messages[-1] == {"role": "assistant", "content": f"Answer: {task['answer']}"}
        assert env.state.tool_errors == 0 and env.state.metrics["answer_matches"] == 1.0
        assert env.state.turn == len(expert_turns(task)) + 1


async def test_wrong_answers_score_zero():
    env = ToolUseEnv(hops=2)
    for seed in range(5):
        await env.areset(seed=seed)
        answer = int(env.state.task["answer"])
        *_, reward, terminated, _, info = await env.astep(f"Answer: {answer + 1}")
        assert reward == 0.0 and terminated and info["metrics"]["answer_matches"] == 0.0
    await env.areset(seed=0)
    *_, reward, _, _, _ = await env.astep("I cannot know that.")
    assert reward == 0.0


@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_values_come_only_from_the_needed_documents(hops):
    for seed in range(10):
        task = generate_task(np.random.default_rng(seed), hops=hops, distractors=3)
        constants = re.findall(r"\d+", task["question"])  # a question states at most one number, a constant
        assert len(constants) <= 1
        looked_up = [v for v in re.findall(r"\d+", task["plan"]["expression"]) if v not in constants]
        needed = {item["doc_id"] for level in task["plan"]["lookups"] for item in level}
        needed_text = " ".join(d["text"] for d in task["documents"] if d["id"] in needed)
        assert looked_up and all(re.search(rf"\b{v}\b", needed_text) for v in looked_up)


async def test_parallel_searches_answer_in_order_and_reads_show_documents():
    env = ToolUseEnv(hops=2, distractors=6)
    await env.areset(seed=3)
    names = [item["name"] for level in env.state.task["plan"]["lookups"] for item in level]
    observation, *_ = await env.astep("".join(call("search", query=name) for name in reversed(names)) + call("search", query="zzz"))
    assert [m["name"] for m in observation] == ["search"] * (len(names) + 1)
    for message, name in zip(observation, reversed(names), strict=False):
        assert message["content"].splitlines()[0].endswith(" " + name)
    assert observation[-1]["content"] == "no documents match 'zzz'"
    doc_id = observation[0]["content"].split()[0]
    observation, *_ = await env.astep(call("read", doc_id=doc_id.upper()))
    assert observation[0]["content"].startswith(names[-1] + " is a ")


async def test_near_name_distractors_show_up_in_search():
    env = ToolUseEnv(hops=1, distractors=8)
    crowded = 0
    for seed in range(10):
        await env.areset(seed=seed)
        name = env.state.task["plan"]["lookups"][0][0]["name"]
        observation, *_ = await env.astep(call("search", query=name))
        lines = observation[0]["content"].splitlines()
        assert lines[0].endswith(" " + name)
        crowded += len(lines) > 1
    assert crowded >= 8


async def test_tool_errors_are_returned_and_counted():
    env = ToolUseEnv(hops=1)
    await env.areset(seed=0)
    observation, _, terminated, _, info = await env.astep(
        call("read", doc_id="d99") + call("search", query="  ") + call("calculator", expression="1/0"))
    assert observation[0]["content"].startswith("Error: no document 'd99'")
    assert observation[1]["content"].startswith("Error: the query is empty")
    assert observation[2]["content"] == "Error: division by zero"
    assert info["tool_errors"] == 3 and not terminated


async def test_read_output_truncated_with_marker():
    env = ToolUseEnv(hops=1, max_tool_output_chars=20)
    await env.areset(seed=0)
    doc_id = env.state.task["plan"]["lookups"][0][0]["doc_id"]
    observation, *_ = await env.astep(call("read", doc_id=doc_id))
    assert observation[0]["content"].startswith(env.state.task["documents"][int(doc_id[1:]) - 1]["text"][:20])
    assert "[... output truncated:" in observation[0]["content"]


async def test_expert_resumes_after_a_stray_turn_and_reports_metrics():
    env = ToolUseEnv(hops=3, distractors=4)
    await env.areset(seed=7)
    await env.astep(call("read", doc_id="d42"))  # a wrong turn first
    total, done, info = 0.0, False, {}
    while not done:
        _, reward, terminated, truncated, info = await env.astep(env.expert_action())
        total, done = total + reward, terminated or truncated
    assert total == 1.0
    assert info["metrics"]["tool_errors"] == 1.0
    assert info["metrics"]["turns"] == len(expert_turns(env.state.task)) + 2
    assert info["metrics"]["tool_calls"] == 1 + sum(len(turn) for turn in expert_turns(env.state.task))


@pytest.mark.parametrize("nested", ["[", '{"a": '])
async def test_expert_passes_over_a_deeply_nested_argument_in_the_history(nested):
    """A policy-written call nested 10,000 deep, which the env answers with an error, does not crash the expert."""
    env = ToolUseEnv(hops=2)
    await env.areset(seed=3)
    depth = 10_000
    closing = "]" if nested == "[" else "}"
    deep = nested * depth + "1" + closing * depth
    first_query = expert_turns(env.state.task)[0][0][1]["query"]
    for arguments in ('{"query": ' + deep + "}", f'{{"query": {json.dumps(first_query)}, "x": {deep}}}'):
        observation, *_ = await env.astep(assistant_message("", [make_tool_call("search", arguments, "deep")]))
        assert observation[0]["content"].startswith("Error:")
    history = list(env.state.messages)
    assert env.expert_action(history) == env.expert_action()  # neither raises RecursionError
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = await env.astep(env.expert_action())
        total, done = total + reward, terminated or truncated
    assert total == 1.0  # the nested call did not count as a plan step; the expert still solves the episode


async def test_same_seed_same_task_and_options_task_replays_exactly():
    a, b = ToolUseEnv(), ToolUseEnv()
    assert (await a.areset(seed=11))[0] == (await b.areset(seed=11))[0]
    assert a.state.task == b.state.task
    task = json.loads(json.dumps(a.state.task))
    other = ToolUseEnv(hops=1, distractors=0)  # the task, not the env's settings, decides
    messages = (await demonstrate(other, task=task))["messages"]
    assert messages[1]["content"] == task["question"]
    questions = set()
    for seed in range(10):
        await a.areset(seed=seed)
        questions.add(a.state.task["question"])
    assert len(questions) == 10


async def test_bad_tasks_and_settings_are_rejected():
    env = ToolUseEnv()
    with pytest.raises(TaskError, match="missing \\['documents'\\]"):
        await env.areset(options={"task": {"question": "q", "answer": "1"}})
    with pytest.raises(TaskError, match="'id', 'title' and 'text'"):
        await env.areset(options={"task": {"question": "q", "answer": "1", "documents": [{"id": "d01"}]}})
    await env.areset(options={"task": {"question": "q", "answer": "1", "documents": []}})
    with pytest.raises(TaskError, match="no 'plan'"):
        env.expert_action()
    with pytest.raises(ValueError, match="hops must be between 1 and 4"):
        ToolUseEnv(hops=5)
    with pytest.raises(ValueError, match="distractors"):
        ToolUseEnv(distractors=(3, 1))


def test_document_index_ranks_exact_title_first():
    index = DocumentIndex([
        {"id": "d01", "title": "North Velmora", "text": "North Velmora is a town."},
        {"id": "d02", "title": "Ana Brisk", "text": "Ana Brisk is a person. Hometown: Velmora."},
        {"id": "d03", "title": "Velmora", "text": "Velmora is a town."},
    ], max_results=2)
    assert [d["id"] for d in index.search("velmora")] == ["d03", "d01"]
    assert index.read("3")["title"] == "Velmora" and index.read(" D3 ")["title"] == "Velmora"


def test_registered_and_passes_check_env():
    check_env(lambda: forge_env.make("forge_env/ToolUse-v0"))
    env = gymnasium.make("forge_env/ToolUse-v0", hops=1)
    observation, info = env.reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["search", "read", "calculator"]
    assert len(observation[0]["content"]) < 120  # the system prompt stays compact


def test_expert_demonstrations_for_sft():
    demos = expert_demonstrations(range(3), hops=2)
    assert len(demos) == 3 and demos == expert_demonstrations((0, 3), hops=2)  # reproducible, call ids included
    for demo in demos:
        messages = demo["messages"]
        assert [m["role"] for m in messages[:3]] == ["system", "user", "assistant"]
        assert messages[-1] == {"role": "assistant", "content": f"Answer: {demo['task']['answer']}"}
        assert [t["function"]["name"] for t in demo["tools"]] == ["search", "read", "calculator"]
        json.dumps(demo)
    assert demos[0]["task"] != expert_demonstrations(range(100, 101), hops=2)[0]["task"]


async def test_expert_action_from_observation_conversation_or_state():
    env = ToolUseEnv(hops=2)
    observation, _ = await env.areset(seed=5)
    first = env.expert_action(observation)
    assert first == env.expert_action() == env.expert_action(env.state)
    assert {c["function"]["name"] for c in first["tool_calls"]} == {"search"}
    observation, *_ = await env.astep(first)
    second = env.expert_action(observation)  # the latest observation alone: the episode log fills in the rest
    assert {c["function"]["name"] for c in second["tool_calls"]} == {"read"}
    # a conversation from elsewhere, with only the opening, starts from the first turn again
    assert env.expert_action(env.state.messages[:2]) == first


async def test_python_tool_keeps_state_within_an_episode_and_not_across():
    """The sandboxed python REPL: variables persist across turns of one episode; a new episode starts clean."""
    env = ToolUseEnv(hops=1, python=True)
    try:
        _, info = await env.areset(seed=3)
        assert "python" in {spec["function"]["name"] for spec in info["tools"]}
        await env.astep(format_hermes_call("python", {"code": "x = 6 * 7"}))
        observation, *_ = await env.astep(format_hermes_call("python", {"code": "print(x + 1)"}))
        assert observation[-1]["role"] == "tool" and observation[-1]["content"].strip() == "43"
        await env.areset(seed=4)  # the previous episode's interpreter is closed; x is gone
        observation, *_ = await env.astep(format_hermes_call("python", {"code": "print(x)"}))
        assert "NameError" in observation[-1]["content"]
    finally:
        env.close()


async def test_served_through_an_env_service_on_monarch():
    """Episodes on a real replica process match a local env step for step; the expert solves them remotely."""
    from forge_env.services import EnvService

    async with await EnvService.launch("forge_env/ToolUse-v0", num_replicas=1, env_kwargs={"hops": [2, 3]}) as envs:
        async def episode(seed):
            local = ToolUseEnv(hops=[2, 3])
            async with envs.env() as remote:
                observation = await remote.areset(seed=seed)
                assert observation == await local.areset(seed=seed)
                done, reward = False, 0.0
                while not done:
                    action = local.expert_action()
                    result = await remote.astep(action)
                    assert result == await local.astep(action)
                    _, reward, terminated, truncated, info = result
                    done = terminated or truncated
                return reward, info["metrics"]

        results = await asyncio.gather(*(episode(seed) for seed in range(8)))
        assert [reward for reward, _ in results] == [1.0] * 8
        assert all(metrics["tool_errors"] == 0 and metrics["tool_calls"] >= 5 for _, metrics in results)
        assert envs.metrics().failures == 0


async def test_demonstrate_refuses_a_failing_expert():
    class WrongExpert(ToolUseEnv):
        def expert_action(self, observation=None):
            return "Answer: -1"

    with pytest.raises(ExpertFailedError, match="earned 0.0, not 1.0"):
        await demonstrate(WrongExpert(hops=1), seed=0)
