"""Coding tasks: the three accepted shapes, told apart by their fields, and their validation.

- HumanEval style: ``{"task_id", "prompt", "entry_point", "test"}`` where ``test`` defines
  ``check(candidate)``; the prompt is a signature with a docstring that the answer completes or restates.
- Assert lists (MBPP style): ``{"prompt", "tests": ["assert f(1) == 2", ...]}`` with optional
  ``"setup"`` (code run before the tests, e.g. imports) and ``"entry_point"``.
- Standard input/output (competitive programming): ``{"prompt", "io": [{"input", "output"}, ...]}``;
  the answer is a whole program, run once per case.

Any task may carry a reference solution (``canonical_solution`` for HumanEval, ``solution`` otherwise).
"""

from __future__ import annotations

from typing import Any, Literal

from forge_env import TaskError

TaskKind = Literal["humaneval", "asserts", "io"]

SHAPES = ('{"prompt", "entry_point", "test"} (HumanEval), {"prompt", "tests": [assert, ...]} '
          '(assert list) or {"prompt", "io": [{"input", "output"}, ...]} (stdin/stdout)')


def task_kind(task: dict[str, Any]) -> TaskKind:
    """Which of the three shapes ``task`` has; TaskError listing them when it has none."""
    if "test" in task and "entry_point" in task:
        return "humaneval"
    if "tests" in task:
        return "asserts"
    if "io" in task:
        return "io"
    raise TaskError(f"a coding task must look like {SHAPES}; got fields {sorted(task)}")


def validate_coding_task(task: Any) -> dict[str, Any]:
    """Check a coding task's fields and types; return it unchanged or raise TaskError saying what is wrong."""
    if not isinstance(task, dict):
        raise TaskError(f"a coding task must be a dict, got {type(task).__name__}")
    kind = task_kind(task)
    if not isinstance(task.get("prompt"), str) or not task["prompt"].strip():
        raise TaskError("a coding task needs a non-empty 'prompt' string")
    if kind == "humaneval":
        for field in ("entry_point", "test"):
            if not isinstance(task[field], str) or not task[field].strip():
                raise TaskError(f"a HumanEval-style task needs a non-empty {field!r} string")
    elif kind == "asserts":
        tests = task["tests"]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
            raise TaskError("'tests' must be a non-empty list of assert statements (strings)")
        if not isinstance(task.get("setup", ""), str):
            raise TaskError("'setup' must be a string of Python code")
    else:
        cases = task["io"]
        if not isinstance(cases, list) or not cases:
            raise TaskError("'io' must be a non-empty list of {'input': str, 'output': str}")
        for index, case in enumerate(cases):
            if not (isinstance(case, dict) and isinstance(case.get("input"), str) and isinstance(case.get("output"), str)):
                raise TaskError(f"io case {index} must be {{'input': str, 'output': str}}, got {case!r}")
    return task


def reference_solution(task: dict[str, Any]) -> str | None:
    """The task's reference solution as a complete program, if it has one."""
    if task_kind(task) == "humaneval":
        body = task.get("canonical_solution")
        return None if body is None else task["prompt"] + body
    return task.get("solution")
