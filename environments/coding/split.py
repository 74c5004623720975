"""Visible and held-out tests: what Coding-v0 may show of a task, and what it grades.

Feedback that names a failing test gives its source away, expected value included (``assert f(3) ==
7``); over a few attempts a policy would collect every test and hard-code the answers at full reward. So
whenever the env shows tests at all (examples in the prompt, failing tests in feedback, the ``run_tests``
tool), each task's tests are split in two:

- *visible* tests: the only ones shown (prompt examples, feedback, ``run_tests``), run on their own so the
  solution never even receives a held-out test's arguments in a run whose errors are shown;
- *held-out* tests: the reward (``pass_rate``, ``all_passed``), never shown; the model only learns whether
  its answer passed them (the episode goes on or ends).

The split is fixed per task: a test is held out when it ranks among the ``ceil(fraction * n)`` lowest of the
task's ``n`` tests by SHA-256 of (task key, test number), the task key being its ``task_id`` (else a hash
of its content). It does not depend on the episode or the seed, so no episode shows a test another
episode grades with. A task with one test holds it out and shows nothing; a task with two or more holds
out at least one and, for a fraction below 1, shows at least one. Tests a visible test cannot run
without (it reads a name a held-out test binds) are held out as well (``steps.steps_for_tests``).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from environments.coding.steps import steps_for_tests, task_steps
from environments.coding.tasks import task_kind

DEFAULT_HELD_OUT_FRACTION = 0.5


@dataclass(frozen=True)
class TestSplit:
    """Test numbers (see ``checker``) of a task's visible and held-out tests."""

    visible: tuple[int, ...]
    held_out: tuple[int, ...]


def task_key(task: dict[str, Any]) -> str:
    """What the split hashes a task by: its ``task_id``, else a digest of its content."""
    if task.get("task_id") is not None:
        return f"id:{task['task_id']}"
    content = {name: task.get(name) for name in ("prompt", "entry_point", "test", "tests", "setup", "io")}
    return "content:" + hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


def test_count(task: dict[str, Any]) -> int:
    """How many tests ``task`` has (constant asserts are not tests: see ``steps``)."""
    if task_kind(task) == "io":
        return len(task["io"])
    return sum(step.is_test for step in task_steps(task))


def split_tests(task: dict[str, Any], fraction: float = DEFAULT_HELD_OUT_FRACTION) -> TestSplit:
    """The task's split for ``fraction`` in (0, 1] (see the module docstring)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"the held-out fraction must be in (0, 1], got {fraction}")
    count = test_count(task)
    key = task_key(task)
    held = max(1, min(count, math.ceil(fraction * count)))
    if fraction < 1 and count >= 2:
        held = min(held, count - 1)
    ranked = sorted(range(count), key=lambda number: hashlib.sha256(f"{key}\0{number}".encode()).digest())
    shown = sorted(ranked[held:])
    if task_kind(task) != "io":
        _, runnable = steps_for_tests(task_steps(task), shown)
        shown = sorted(runnable)
    return TestSplit(visible=tuple(shown), held_out=tuple(n for n in range(count) if n not in set(shown)))
