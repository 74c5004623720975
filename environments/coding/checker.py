"""Running a candidate solution against a coding task's tests in the sandbox.

:class:`CodeChecker` is what Coding-v0 scores with (and what ``benchmarks/sandbox_bench.py`` measures).
Function tasks (HumanEval style, assert lists) run as one sandbox execution through the harness; stdin/
stdout tasks run the program once per case, concurrently. The result is a :class:`CheckReport` with one
outcome per test and a feedback text for the model.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from environments.coding.extract import defines
from environments.coding.harness import (
    CALLS_CALL,
    HARNESS_CALL,
    HARNESS_PRELUDE,
    StaticTest,
    Step,
    assert_steps,
    calls_input,
    harness_input,
    humaneval_steps,
    judge_static,
    names_used,
    new_nonce,
    parse_harness_output,
    static_tests,
    trusted_prompt_code,
)
from environments.coding.tasks import task_kind
from forge_env.sandbox import ExecResult, Sandbox, shared_sandbox

MAX_SHOWN_CHARS = 400


@dataclass
class TestOutcome:
    """One test: what it is (its source, or the stdin of an io case), whether it passed, and why not."""

    name: str
    passed: bool
    error: str | None = None


@dataclass
class CheckReport:
    """The outcome of every test of one solution, plus what went wrong as a whole (if anything)."""

    outcomes: list[TestOutcome] = field(default_factory=list)
    load_error: str | None = None
    killed_reason: str | None = None
    output: str = ""
    duration_s: float = 0.0

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

    def feedback(self, max_failures: int = 3) -> str:
        """A report for the model: the count, then up to ``max_failures`` failing tests with their errors."""
        lines = [f"{self.passed}/{self.total} tests passed."]
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (for ``info`` and logs)."""
        return {"passed": self.passed, "total": self.total, "killed_reason": self.killed_reason,
                "load_error": self.load_error is not None, "duration_s": round(self.duration_s, 4)}


_KILL_EXPLANATIONS = {
    "timeout": "it ran past the time limit",
    "cpu": "it used up its CPU time",
    "memory": "it ran out of memory",
    "output_limit": "it printed too much",
    "ended_early": "the program exited before all tests ran",
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

    async def check(self, task: dict[str, Any], code: str) -> CheckReport:
        """Run ``code`` against every test of ``task``."""
        kind = task_kind(task)
        if kind == "io":
            return await self._check_io(task, code)
        trusted, exposed = "", None
        if kind == "humaneval":
            steps = humaneval_steps(task["test"], task["entry_point"])
            trusted, exposed = trusted_prompt_code(task["prompt"], task["entry_point"]), (task["entry_point"],)
            callables = {"candidate": task["entry_point"], task["entry_point"]: task["entry_point"]}
        else:
            steps = assert_steps(task["tests"], task.get("setup"))
            exposed = names_used(tuple(step.source for step in steps))
            callables = {name: name for name in exposed}
        solution = solution_program(task, code)
        statics = None if task.get("setup") else static_tests(steps, callables)
        if statics is not None:
            return await self._check_calls(steps, statics, solution)
        nonce = new_nonce()
        payload = harness_input(solution, steps, nonce, trusted=trusted, exposed=exposed)
        result = await self.sandbox.run(HARNESS_CALL, prelude=HARNESS_PRELUDE, timeout=self.timeout, stdin=payload)
        harness = parse_harness_output(result.stdout, nonce)
        report = CheckReport(load_error=harness.load_error, output=harness.output, duration_s=result.duration_s,
                             killed_reason=result.killed_reason)
        unfinished = _unfinished_reason(result)
        for index, step in enumerate(steps):
            if not step.is_test:
                continue
            ok, error = harness.steps.get(index, (False, unfinished))
            report.outcomes.append(TestOutcome(step.source, ok, error))
        return _finish(report, harness.finished)

    async def _check_calls(self, steps: tuple[Step, ...], statics: tuple[StaticTest, ...], solution: str) -> CheckReport:
        """Every test is one call with literal arguments: the sandbox only makes the calls (one process,
        never seeing the expected values) and the results are compared here."""
        nonce = new_nonce()
        result = await self.sandbox.run(CALLS_CALL, prelude=HARNESS_PRELUDE, timeout=self.timeout,
                                        stdin=calls_input(solution, statics, nonce))
        harness = parse_harness_output(result.stdout, nonce)
        report = CheckReport(load_error=harness.load_error, output=harness.output, duration_s=result.duration_s,
                             killed_reason=result.killed_reason)
        unfinished = _unfinished_reason(result)
        tests = iter(statics)
        call = 0
        for step in steps:
            if not step.is_test:
                continue
            test = next(tests)
            record = None
            if test.name is not None:
                record, call = harness.calls.get(call), call + 1
            if harness.load_error is not None and test.name is not None:
                ok, error = False, harness.load_error
            else:
                ok, error = judge_static(test, record)
                if record is None and test.name is not None:
                    error = unfinished
            report.outcomes.append(TestOutcome(step.source, ok, error))
        return _finish(report, harness.finished)

    async def _check_io(self, task: dict[str, Any], code: str) -> CheckReport:
        cases = task["io"]
        results = await asyncio.gather(*(self.sandbox.run(code, stdin=case["input"], timeout=self.timeout)
                                         for case in cases))
        report = CheckReport(duration_s=max(r.duration_s for r in results))
        for case, result in zip(cases, results, strict=True):
            got = normalise_output(result.stdout)
            passed = result.ok and got == normalise_output(case["output"])
            error = None
            if not passed:
                error = _io_error(case, result)
                report.killed_reason = report.killed_reason or result.killed_reason
            report.outcomes.append(TestOutcome(f"input:\n{case['input'].rstrip()}", passed, error))
        return report


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
