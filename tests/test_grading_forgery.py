"""Solutions that implement nothing and try to forge their grade instead: every one must score 0.

Before the judge/candidate split (environments/coding/harness.py) each of these passed every test: the
solution ran in the same interpreter as its tests.
"""

from __future__ import annotations

import pytest

from environments.coding import CodeChecker, load_bundled
from forge_env.sandbox import make_sandbox
from tests.sandbox_support import requires_bwrap

pytestmark = requires_bwrap

TASKS = {task["task_id"]: task for task in load_bundled()}
HUMANEVAL = TASKS["forge/humaneval/0"]  # running_max
ASSERTS = TASKS["forge/asserts/6"]  # digit_sum
#: Tests that are not one literal call each run in the judge process (the others are only called in the
#: sandbox and compared on the host): both paths must hold.
LOOPED = {"prompt": "digit_sum", "tests": ["for n, s in [(1234, 10), (-99, 18)]:\n    assert digit_sum(n) == s",
                                           "assert digit_sum(0) + 0 == 0"]}

#: Walk up the stack to the harness, then report every test as passed with its own nonce and fd.
FRAME_WALK = """
import os, sys
frame = sys._getframe()
while frame is not None:
    seen = frame.f_locals
    if 'nonce' in seen and 'emit' in seen:
        for index in range(50):
            seen['emit']({'step': index, 'ok': True})
        seen['emit']({'done': True, 'output': ''})
        os._exit(0)
    frame = frame.f_back

def {name}(*args, **kwargs):
    return None
"""

#: Make every later exec (the harness runs each test with exec) do nothing.
REPLACED_EXEC = """
import builtins
builtins.exec = lambda *args, **kwargs: None

def {name}(*args, **kwargs):
    return None
"""

#: Return an object equal to anything.
ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__

def {name}(*args, **kwargs):
    return Anything()
"""

#: An int subclass equal to everything: crosses the boundary as the plain int it really is.
EQUAL_INT = """
class Sly(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__

def {name}(*args, **kwargs):
    return Sly(-1)
"""


@pytest.fixture
async def checker():
    sandbox = make_sandbox("process", max_concurrency=2, wall_timeout_s=5, cpu_seconds=3, memory_mb=256)
    yield CodeChecker(sandbox)
    await sandbox.close()


@pytest.mark.parametrize("forgery", [FRAME_WALK, REPLACED_EXEC, ALWAYS_EQUAL, EQUAL_INT],
                         ids=["frame-walk", "replaced-exec", "always-equal", "equal-int"])
@pytest.mark.parametrize("task", [HUMANEVAL, ASSERTS, LOOPED], ids=["humaneval", "asserts", "judged"])
async def test_a_forged_grade_scores_nothing(checker, task, forgery):
    name = task.get("entry_point") or "digit_sum"
    report = await checker.check(task, forgery.replace("{name}", name))
    assert report.total > 0 and report.passed == 0, report.feedback()


async def test_a_solution_cannot_stand_in_for_the_tests_builtins(checker):
    task = {"prompt": "echo", "tests": ["assert len(echo('abc')) == 5", "assert sorted(echo([2, 1])) == [9]"]}
    report = await checker.check(task, "def echo(s):\n    return s\ndef len(x):\n    return 5\n"
                                       "def sorted(x):\n    return [9]\n")
    assert report.passed == 0, report.feedback()


async def test_the_real_solutions_still_pass_and_errors_still_explain(checker):
    for task in (HUMANEVAL, ASSERTS, {**LOOPED, "solution": ASSERTS["solution"]}):
        assert (await checker.check(task, task.get("canonical_solution") or task["solution"])).all_passed
    for task in (ASSERTS, LOOPED):
        report = await checker.check(task, "def digit_sum(n):\n    return object()\n")
        assert report.passed == 0 and "cannot compare outside the sandbox" in report.feedback()
    for task in (ASSERTS, LOOPED):
        raising = await checker.check(task, "def digit_sum(n):\n    raise ValueError('nope')\n")
        feedback = raising.feedback()
        assert "ValueError: nope" in feedback and 'File "solution.py", line 2, in digit_sum' in feedback


async def test_plain_values_cross_intact(checker):
    task = {"prompt": "echo", "tests": [
        "assert echo((1, [2.5, None], {'a': {3}}, frozenset({b'x'}), 1j, True)) == "
        "(1, [2.5, None], {'a': {3}}, frozenset({b'x'}), 1j, True)",
        "assert type(echo((1,))) is tuple and type(echo(True)) is bool and echo(10**5000) == 10**5000",
        "import math\nassert math.isnan(echo(float('nan'))) and echo(float('-inf')) == float('-inf')",
        "assert echo(x=[1]) == {'x': [1]}",
    ]}
    report = await checker.check(task, "def echo(*args, **kwargs):\n    return kwargs if kwargs else args[0]\n")
    assert report.all_passed, report.feedback()
