"""ToolEnv: a tool environment in a few lines — tools, a task source and a rubric.

A thin layer over :class:`~forge_env.core.env.TextEnv` (which owns the turn rules: concurrent
tool calls answered in order, per-tool timeouts, output truncation, the per-episode
tool-call cap, tool errors returned to the model). ToolEnv adds what most tool
environments repeat:

* a task source that is either a list of tasks or a function ``rng -> task``;
* a default rubric, :func:`answer_matches`, comparing the final answer with ``task["answer"]``;
* ``tool_calls``, ``tool_errors`` and ``turns`` reported with the rubric's metrics.

Example::

    env = ToolEnv(tools=[calculator], tasks=lambda rng: {"question": "2+2?", "answer": "4"})
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from forge_env.core.env import AnswerOutcome, EpisodeState, Task, TextEnv
from forge_env.core.rubric import Rubric
from forge_env.tools import Tool
from forge_env.types import Message

TaskSource = Sequence[Task] | Callable[[np.random.Generator], Task]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def final_answer_text(completion: str) -> str:
    """The answer part of a final turn: what follows the last ``Answer:`` marker, else the whole text."""
    marker = completion.lower().rfind("answer:")
    text = completion[marker + len("answer:"):] if marker >= 0 else completion
    return text.strip()


def answer_matches(completion: str, answer: Any) -> float:
    """1.0 when the final answer equals the reference: numerically when the reference is a number
    (the last number in the answer counts, ``48,169`` reads as 48169), else as case-insensitive text."""
    if answer is None:
        return 0.0
    given = final_answer_text(completion)
    reference = str(answer).strip()
    if _NUMBER.fullmatch(reference.replace(",", "")):
        numbers = _NUMBER.findall(_THOUSANDS.sub("", given))
        return float(bool(numbers) and math.isclose(float(numbers[-1]), float(reference.replace(",", "")),
                                                    rel_tol=1e-9, abs_tol=1e-9))
    normalise = lambda text: " ".join(text.lower().strip().rstrip(".!").split())  # noqa: E731
    return float(normalise(given) == normalise(reference))


class ToolEnv(TextEnv):
    """A tool environment from parts: ``ToolEnv(tools=[...], tasks=..., rubric=...)``.

    Args:
        tools: the :class:`~forge_env.tools.Tool` objects offered in every episode (``@tool`` functions,
            :data:`~forge_env.tools.calculator.calculator`, MCP tools, ...).
        tasks: a list of task dicts, or a function ``rng -> task`` that generates one with the seeded RNG.
        rubric: scores the final answer; default ``Rubric([answer_matches])`` (1 when it equals ``task["answer"]``).
        system_prompt: the opening system message, if any.
        **kwargs: any :class:`~forge_env.core.env.TextEnv` option (``max_turns``, ``tool_timeout``,
            ``max_tool_calls``, ``max_tool_output_chars``, ``parallel_tool_calls``, ...).
    """

    def __init__(
        self,
        tools: Sequence[Tool] = (),
        tasks: TaskSource | None = None,
        rubric: Rubric | None = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ):
        bad = [t for t in tools if not isinstance(t, Tool)]
        if bad:
            raise TypeError(f"ToolEnv tools must be Tool objects (decorate functions with @tool), got {bad!r}")
        self.task_fn: Callable[[np.random.Generator], Task] | None = None
        if callable(tasks):
            self.task_fn, tasks = tasks, None
        elif tasks is not None and not isinstance(tasks, Sequence):
            raise TypeError(f"tasks must be a list of task dicts or a function rng -> task, got {type(tasks).__name__}")
        super().__init__(tasks=tasks, tools=tools, rubric=rubric if rubric is not None else Rubric([answer_matches]),
                         system_prompt=system_prompt, **kwargs)

    def sample_task(self, rng: np.random.Generator) -> Task:
        """Draw a task: call the task function with the seeded RNG, or pick from the task list."""
        if self.task_fn is not None:
            return self.task_fn(rng)
        return super().sample_task(rng)

    async def on_final_answer(self, message: Message, state: EpisodeState) -> AnswerOutcome:
        """Score with the rubric and report the episode's tool calls, tool errors and turns as metrics."""
        outcome = await super().on_final_answer(message, state)
        outcome.metrics.update(episode_metrics(state))
        return outcome


def episode_metrics(state: EpisodeState) -> dict[str, float]:
    """The tool-use counters of an episode, as rubric-style metrics."""
    return {"tool_calls": float(state.tool_calls), "tool_errors": float(state.tool_errors), "turns": float(state.turn)}
