"""A tiny guessing environment that exercises the whole TextEnv contract in tests.

The task is a secret number; the ``hint`` tool says "higher"/"lower"/"correct"; the
final answer is scored 1 when it names the secret. ``explode`` and ``nap`` are tools
that fail and hang, to exercise tool errors and timeouts.
"""

from __future__ import annotations

import asyncio
import re

import numpy as np

from forge_env import Rubric, TextEnv, ToolError, tool


def make_tools(secret_holder: dict) -> list:
    @tool
    def hint(guess: int) -> str:
        """Compare a guess with the secret number.

        Args:
            guess: the number to compare.
        """
        secret = secret_holder["secret"]
        return "correct" if guess == secret else ("higher" if guess < secret else "lower")

    @tool
    def explode(reason: str = "boom") -> str:
        """A tool that always fails."""
        raise ToolError(f"exploded: {reason}")

    @tool
    def crash() -> str:
        """A tool with a bug."""
        return str(1 / 0)

    @tool(timeout=0.2)
    async def nap(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "awake"

    @tool
    def shout(text: str, times: int = 1) -> str:
        """Repeat text in capitals."""
        return text.upper() * times

    return [hint, explode, crash, nap, shout]


def correct(completion: str, answer: str) -> float:
    numbers = re.findall(r"-?\d+", completion)
    return float(bool(numbers) and numbers[-1] == str(answer))


def polite(completion: str) -> float:
    return float("please" in completion.lower())


class GuessEnv(TextEnv):
    """Guess a secret number between 1 and ``high`` with the help of the ``hint`` tool."""

    def __init__(self, high: int = 100, **kwargs):
        self._secret = {"secret": 0}
        kwargs.setdefault("max_turns", 6)
        kwargs.setdefault("max_tool_output_chars", 50)
        super().__init__(tools=make_tools(self._secret), rubric=Rubric([correct, polite], weights=[1.0, 0.0]),
                         system_prompt="Find the secret number. Use the hint tool.", **kwargs)
        self.high = high

    def sample_task(self, rng: np.random.Generator) -> dict:
        secret = int(rng.integers(1, self.high + 1))
        return {"question": f"I am thinking of a number from 1 to {self.high}.", "answer": str(secret)}

    async def setup_episode(self, state) -> None:
        self._secret["secret"] = int(state.task["answer"])
