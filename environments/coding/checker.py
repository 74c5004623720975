"""Running a candidate solution against a coding task's tests in the sandbox.

:class:`CodeChecker` is what Coding-v0 scores with (and what ``benchmarks/sandbox_bench.py`` measures).
Function tasks (HumanEval style, assert lists) run as one sandbox execution through the harness, on one
of two paths (:func:`grading_path`): *calls-only* when every test is one call with constant arguments
(the sandbox makes the calls, the host compares), else *judge/candidate* (see ``harness.py``). stdin/
stdout tasks run the program once per case, concurrently. Runs the sandbox itself failed are retried
under the rule of ``forge_env.workspace.graded_run``. The result is a :class:`CheckReport` with one outcome per test
and a feedback text for the model. Tests are numbered from 0 in task order (a function task's test steps,
an io task's cases); ``check(..., tests=...)`` runs only some of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from environments.coding.extract import defines
from environments.coding.harness import (
    CALLS_CALL,
    HARNESS_CALL,
    HARNESS_PRELUDE,
    StaticTest,
    calls_input,
    harness_input,
    judge_static,
    new_nonce,
    parse_harness_output,
    static_tests,
    trusted_prompt_code,
)
from environments.coding.steps import Step, names_used, steps_for_tests, task_steps
from environments.coding.tasks import task_kind
from forge_env.sandbox import ExecResult, Sandbox, shared_sandbox
from forge_env.workspace import WORKER_LOST, GradedRun, graded_run

MAX_SHOWN_CHARS = 400


@dataclass
class TestOutcome:
    """One test: what it is (its source, or the stdin of an io case), whether it passed, and why not;
    ``index``: its number in the task (see the module docstring)."""

    name: str
    passed: bool
    error: str | None = None
    index: int = -1


@dataclass
class CheckReport:
    """The outcome of every test of one solution, plus what went wrong as a whole (if anything).

    A per-test report, the input Coding-v0 decides a reward from (``pass_rate``, the attempt schedule), not a
    grading result: the result noun is :class:`~forge_env.core.verdict.Verdict`."""

    outcomes: list[TestOutcome] = field(default_factory=list)
    load_error: str | None = None
    killed_reason: str | None = None
    output: str = ""
    duration_s: float = 0.0
    retries: int = 0  # grading runs run again after the sandbox failed (forge_env.workspace.graded_run)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def passed(self) -> int:
        return sum(outcome.passed for outcome in self.outcomes)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def feedback(self, max_failures: int = 3, *, header: str | None = None) -> str:
        """A report for the model: the count (or ``header``), then up to ``max_failures`` failing tests
        with their errors."""
        lines = [header if header is not None else f"{self.passed}/{self.total} tests passed."]
        if self.killed_reason:
            lines.append(f"The run was stopped: {_KILL_EXPLANATIONS.get(self.killed_reason, self.killed_reason)}.")
        if self.load_error:
            lines.append(_clip(self.load_error, 1500))
        elif max_failures > 0:
            failures = [outcome for outcome in self.outcomes if not outcome.passed]
            for outcome in failures[:max_failures]:
                lines.append(f"Failed: {_clip(outcome.name.strip(), MAX_SHOWN_CHARS)}")
                if outcome.error:
                    lines.append(_indent(_clip(outcome.error.strip(), 1000)))
            if len(failures) > max_failures:
                lines.append(f"... and {len(failures) - max_failures} more failing tests.")
        return "\n".join(lines)

    def only(self, tests: Collection[int]) -> CheckReport:
        """This report restricted to the tests numbered in ``tests``."""
        wanted = set(tests)
        return replace(self, outcomes=[outcome for outcome in self.outcomes if outcome.index in wanted])

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (for ``info`` and logs)."""
        return {"passed": self.passed, "total": self.total, "killed_reason": self.killed_reason,
                "load_error": self.load_error is not None, "duration_s": round(self.duration_s, 4),
                "retries": self.retries}


_KILL_EXPLANATIONS = {
    "timeout": "it ran past the time limit",
    "cpu": "it used up its CPU time",
    "memory": "it ran out of memory",
    "output_limit": "it printed too much",
    "ended_early": "the program exited before all tests ran",
    WORKER_LOST: "it brought its sandbox worker down, twice",
}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " ...[truncated]"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def normalise_output(text: str) -> str:
    """Outputs are compared line by line, ignoring trailing spaces and leading/trailing blank lines."""
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def solution_program(task: dict[str, Any], code: str) -> str:
    """The program to test: HumanEval answers complete the prompt (a body) or restate the whole function,
    in which case the prompt still comes first for its imports and helpers."""
    if task_kind(task) != "humaneval":
        return code
    if defines(code, task["entry_point"]):
        return task["prompt"] + "\n" + code
    return task["prompt"] + code


class CodeChecker:
    """Checks solutions against tasks in a sandbox.

    Args:
        sandbox: where the code runs (default: the process-wide shared sandbox).
        timeout: wall-clock seconds per sandbox execution (one per function task, one per io case).
    """

    def __init__(self, sandbox: Sandbox | None = None, *, timeout: float = 10.0) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._sandbox = sandbox
        self.timeout = timeout

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = shared_sandbox()
        return self._sandbox

    async def check(self, task: dict[str, Any], code: str, tests: Collection[int] | None = None) -> CheckReport:
        """Run ``code`` against the tests of ``task``: every one, or only those numbered in ``tests`` (the
        others never run; for function tasks see ``steps.steps_for_tests``, which may leave out more)."""
        kind = task_kind(task)
        if kind == "io":
            return await self._check_io(task, code, tests)
        steps = task_steps(task)
        numbers = tuple(range(sum(step.is_test for step in steps)))
        if tests is not None:
            steps, numbers = steps_for_tests(steps, tests)
        trusted, exposed, callables = _function_names(task, steps)
        solution = solution_program(task, code)
        statics = None if task.get("setup") else static_tests(steps, callables)
        if statics is not None:
            return await self._check_calls(steps, numbers, statics, solution)
        nonce = new_nonce()
        payload = harness_input(solution, steps, nonce, trusted=trusted, exposed=exposed)
        run = await self._run(HARNESS_CALL, payload)
        result = run.result
        harness = parse_harness_output(result.stdout, nonce)
        report = CheckReport(load_error=harness.load_error, output=harness.output, duration_s=result.duration_s,
                             killed_reason=result.killed_reason, retries=run.retries)
        unfinished = _unfinished_reason(result)
        tested = iter(numbers)
        for index, step in enumerate(steps):
            if not step.is_test:
                continue
            ok, error = harness.steps.get(index, (False, unfinished))
            report.outcomes.append(TestOutcome(step.source, ok, error, next(tested)))
        return _finish(report, harness.finished)

    async def _run(self, program: str, stdin: str) -> GradedRun:
        return await graded_run(self.sandbox, program, stdin=stdin, timeout=self.timeout, prelude=HARNESS_PRELUDE)

    async def _check_calls(self, steps: tuple[Step, ...], numbers: tuple[int, ...], statics: tuple[StaticTest, ...],
                           solution: str) -> CheckReport:
        """Every test is one call with constant arguments: the sandbox only makes the calls (one process,
        never seeing the expected values) and the results are compared here."""
        nonce = new_nonce()
        run = await self._run(CALLS_CALL, calls_input(solution, statics, nonce))
        result = run.result
        harness = parse_harness_output(result.stdout, nonce)
        report = CheckReport(load_error=harness.load_error, output=harness.output, duration_s=result.duration_s,
                             killed_reason=result.killed_reason, retries=run.retries)
        unfinished = _unfinished_reason(result)
        tests = [step for step in steps if step.is_test]
        for call, (step, test, number) in enumerate(zip(tests, statics, numbers, strict=True)):
            record = harness.calls.get(call)
            if harness.load_error is not None:
                ok, error = False, harness.load_error  # code that does not load passes nothing
            else:
                ok, error = judge_static(test, record)
                if record is None:
                    error = unfinished
            report.outcomes.append(TestOutcome(step.source, ok, error, number))
        return _finish(report, harness.finished)

    async def _check_io(self, task: dict[str, Any], code: str, tests: Collection[int] | None) -> CheckReport:
        numbers = range(len(task["io"])) if tests is None else sorted(set(tests) & set(range(len(task["io"]))))
        cases = [task["io"][number] for number in numbers]
        runs = await asyncio.gather(*(graded_run(self.sandbox, code, stdin=case["input"], timeout=self.timeout)
                                      for case in cases))
        report = CheckReport(duration_s=max((run.result.duration_s for run in runs), default=0.0),
                             retries=sum(run.retries for run in runs))
        for number, case, run in zip(numbers, cases, runs, strict=True):
            result = run.result
            got = normalise_output(result.stdout)
            passed = result.ok and got == normalise_output(case["output"])
            error = None
            if not passed:
                error = _io_error(case, result)
                report.killed_reason = report.killed_reason or result.killed_reason
            report.outcomes.append(TestOutcome(f"input:\n{case['input'].rstrip()}", passed, error, number))
        return report


def grading_path(task: dict[str, Any]) -> Literal["calls", "judge", "io"]:
    """How ``CodeChecker`` grades ``task``: "calls" (calls-only: the solution's process makes the calls,
    the host compares with expected values that never enter the sandbox), "judge" (the judge process runs
    the tests, the solution runs in a candidate process it cannot reach) or "io" (run per case, output
    compared on the host)."""
    if task_kind(task) == "io":
        return "io"
    steps = task_steps(task)
    if task.get("setup") or static_tests(steps, _function_names(task, steps)[2]) is None:
        return "judge"
    return "calls"


def _function_names(task: dict[str, Any], steps: tuple[Step, ...]
                    ) -> tuple[str, tuple[str, ...] | None, dict[str, str]]:
    """(the task code the judge runs itself, the solution's names the tests may use, test name -> solution
    name of the functions the calls-only path may call)."""
    if task_kind(task) == "humaneval":
        entry = task["entry_point"]
        return trusted_prompt_code(task["prompt"], entry), (entry,), {"candidate": entry, entry: entry}
    exposed = names_used(tuple(step.source for step in steps))
    return "", exposed, {name: name for name in exposed}


def _finish(report: CheckReport, finished: bool) -> CheckReport:
    if not finished and report.killed_reason is None:
        report.killed_reason = "ended_early"  # os._exit or a crash: the tests it cut short failed
    return report


def _unfinished_reason(result: ExecResult) -> str:
    if result.killed_reason:
        return f"not finished: the run was stopped ({result.killed_reason})"
    return "not run: the program ended before this test"


def _io_error(case: dict[str, str], result: ExecResult) -> str:
    if result.killed_reason:
        reason = f"stopped ({_KILL_EXPLANATIONS.get(result.killed_reason, result.killed_reason)})"
    elif result.exit_code:
        reason = f"exited with code {result.exit_code}"
    else:
        reason = "wrong output"
    parts = [reason, f"expected:\n{_clip(case['output'].rstrip(), MAX_SHOWN_CHARS)}",
             f"got:\n{_clip(result.stdout.rstrip(), MAX_SHOWN_CHARS)}"]
    if result.stderr.strip():
        parts.append(f"stderr:\n{_clip(result.stderr.strip()[-1000:], 1000)}")
    return "\n".join(parts)
