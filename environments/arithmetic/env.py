"""Arithmetic-v0: seeded arithmetic questions answered with the help of a ``calculator`` tool.

Built for tiny models and CPU demos, so every string is short (each character is a
token for a byte-level model):

    system: Use the calculator tool, then answer with the number.
    user:   What is 23+45*2?
    assistant -> calculator(expression="23+45*2")   tool -> 113
    assistant: 113                                   reward 1

The reward is 1 for the right number (the last number in the final turn), else 0; the
rubric also reports ``format_ok`` (the final turn is the bare number) and ``used_tool``.
``expert_action`` gives the ideal next assistant turn and ``expert_demonstrations`` whole
conversations for an SFT warm-up, for any range of task seeds.
"""

from __future__ import annotations

import re
import zlib
from fractions import Fraction
from typing import Any

import numpy as np

from environments.arithmetic.tasks import SPLIT_SEED_RANGES, SPLITS, Difficulty, generate_task
from forge_env import EpisodeState, Rubric, TaskError, TextEnv
from forge_env.core.demonstrations import demonstrate
from forge_env.tools.calculator import calculator
from forge_env.types import Message, assistant_message, make_tool_call
from forge_env.utils.aio import run_sync

SYSTEM_PROMPT = "Use the calculator tool, then answer with the number."
_QUESTION_RE = re.compile(r"What is (.+)\?\s*$")
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def _last_number(text: str) -> Fraction | None:
    numbers = _NUMBER_RE.findall(text.replace(",", ""))
    return Fraction(numbers[-1]) if numbers else None


def correct(completion: str, answer: str) -> float:
    """1.0 when the last number in the final turn equals the answer exactly."""
    predicted = _last_number(completion)
    return float(predicted is not None and predicted == Fraction(answer))


def format_ok(completion: str) -> float:
    """1.0 when the final turn is just the number."""
    return float(_NUMBER_RE.fullmatch(completion.strip()) is not None)


def used_tool(state: EpisodeState) -> float:
    """1.0 when the calculator answered at least one call without an error."""
    return float(any(
        m["role"] == "tool" and m.get("name") == "calculator" and not m["content"].startswith("Error")
        for m in state.messages
    ))


def arithmetic_rubric() -> Rubric:
    """Reward = correct; format_ok and used_tool are reported as metrics only."""
    return Rubric([correct, format_ok, used_tool], weights=[1.0, 0.0, 0.0])


def expert_tool_call(expression: str) -> Message:
    """The assistant turn that asks the calculator for ``expression`` (deterministic call id)."""
    call_id = f"call_{zlib.crc32(expression.encode()):08x}"
    return assistant_message("", [make_tool_call("calculator", {"expression": expression}, call_id)])


class ArithmeticEnv(TextEnv):
    """Arithmetic questions with a calculator tool; see the module docstring.

    Its episodes are plain data, so they snapshot and restore (``supports_snapshots``).

    Args:
        num_operands: operands per expression, an int or an inclusive (low, high) range.
        digits: digits per operand, an int or an inclusive (low, high) range.
        operators: which of ``+-*/`` may appear.
        split: ``"train"``, ``"validation"`` or ``"test"``; splits never share an expression.
        seed_range: task seeds that ``reset(seed=...)`` draws from (default: the split's range).
        system_prompt, max_turns, **kwargs: as for :class:`TextEnv`.
    """

    supports_snapshots = True

    def __init__(
        self,
        *,
        num_operands: int | tuple[int, int] = (2, 3),
        digits: int | tuple[int, int] = (1, 2),
        operators: str = "+-*",
        split: str = "train",
        seed_range: range | tuple[int, int] | None = None,
        system_prompt: str | None = SYSTEM_PROMPT,
        max_turns: int = 4,
        **kwargs: Any,
    ):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        kwargs.setdefault("rubric", arithmetic_rubric())
        super().__init__(tools=[calculator], system_prompt=system_prompt, max_turns=max_turns, **kwargs)
        self.difficulty = Difficulty.of(num_operands, digits, operators)
        self.split = split
        seeds = SPLIT_SEED_RANGES[split] if seed_range is None else range(*seed_range) if isinstance(
            seed_range, tuple) else seed_range
        if len(seeds) == 0:
            raise ValueError(f"seed_range {seed_range!r} is empty")
        self.seed_range: range = seeds

    def task_for_seed(self, task_seed: int) -> dict[str, Any]:
        """The task generated from ``task_seed`` with this env's difficulty and split."""
        return generate_task(task_seed, self.difficulty, self.split)

    def sample_task(self, rng: np.random.Generator) -> dict[str, Any]:
        return self.task_for_seed(self.seed_range[int(rng.integers(len(self.seed_range)))])

    def validate_task(self, task: dict[str, Any]) -> dict[str, Any]:
        task = super().validate_task(task)
        if not isinstance(task.get("question"), str) or "answer" not in task:
            raise TaskError('an arithmetic task needs {"question": "What is 2+3?", "answer": "5"}')
        try:
            Fraction(str(task["answer"]))
        except ValueError:
            raise TaskError(f"the answer of an arithmetic task must be a number, got {task['answer']!r}") from None
        return {**task, "answer": str(task["answer"])}

    def expert_action(self, observation: list[Message] | EpisodeState | None = None) -> Message:
        """The ideal next assistant turn: call the calculator with the expression, then answer its result.

        Pass the latest observation (or the whole message list, or an EpisodeState); with
        nothing, the env's running episode is used.
        """
        if isinstance(observation, EpisodeState):
            state, messages = observation, observation.messages
        else:
            state = self.state
            messages = observation if observation is not None else state.messages if state else []
        last = messages[-1] if messages else None
        if last and last["role"] == "tool" and not last["content"].startswith("Error"):
            return assistant_message(last["content"].strip())
        questions = (_QUESTION_RE.search(m.get("content") or "") for m in reversed(messages) if m["role"] == "user")
        expression = next((q.group(1) for q in questions if q), None)
        if expression is None and state is not None:
            expression = state.task.get("expression")
        if expression is None:
            raise ValueError("expert_action cannot find the expression: pass the reset observation or the episode state")
        return expert_tool_call(expression)


def expert_demonstrations(seed_range: range | tuple[int, int], **env_kwargs: Any) -> list[dict[str, Any]]:
    """Expert conversations for an SFT warm-up, one per task seed in ``seed_range``.

    Each item is ``{"messages": [system, user, assistant(tool call), tool, assistant(answer)],
    "tools": [tool specs], "task": task}`` (the "messages"/"tools" layout of chat SFT
    datasets). ``env_kwargs`` set the difficulty and split as for :class:`ArithmeticEnv`.
    """
    seeds = range(*seed_range) if isinstance(seed_range, tuple) else seed_range
    env = ArithmeticEnv(**env_kwargs)

    async def collect() -> list[dict[str, Any]]:
        return [await demonstrate(env, task=env.task_for_seed(seed)) for seed in seeds]

    return run_sync(collect())
