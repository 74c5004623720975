"""Seeded generation of arithmetic tasks, with held-out splits.

A task is generated from an integer *task seed* and the difficulty settings (number of
operands, digits per operand, operators), so the same seed always gives the same task.
Splits are held out twice over: each split draws task seeds from its own range
(``SPLIT_SEED_RANGES``), and an expression belongs to exactly one split by a hash of its
text, so no expression of the test split ever appears in training, whatever the seeds.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any

from forge_env.tools.calculator import calculate

SPLITS: tuple[str, ...] = ("train", "validation", "test")
# Which hash buckets (crc32 % 10) of an expression's text belong to each split.
_SPLIT_BUCKETS = {"train": frozenset(range(2, 10)), "validation": frozenset({1}), "test": frozenset({0})}
SPLIT_SEED_RANGES: dict[str, range] = {
    "train": range(0, 1_000_000),
    "validation": range(1_000_000, 1_100_000),
    "test": range(2_000_000, 2_100_000),
}
ALLOWED_OPERATORS = "+-*/"
_MAX_TRIES = 1_000


def _as_range(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    low, high = (value, value) if isinstance(value, int) else tuple(value)
    if not 1 <= low <= high:
        raise ValueError(f"{name} must be a positive int or a (low, high) pair with low <= high, got {value!r}")
    return low, high


@dataclass(frozen=True)
class Difficulty:
    """How hard the generated tasks are: operand count and digits per operand (each an inclusive range)."""

    num_operands: tuple[int, int] = (2, 3)
    digits: tuple[int, int] = (1, 2)
    operators: str = "+-*"

    @classmethod
    def of(cls, num_operands: int | tuple[int, int], digits: int | tuple[int, int], operators: str) -> Difficulty:
        """Build from loose user input, checking it."""
        operands = _as_range(num_operands, "num_operands")
        if operands[0] < 2:
            raise ValueError(f"num_operands must be at least 2, got {num_operands!r}")
        if not operators or set(operators) - set(ALLOWED_OPERATORS):
            raise ValueError(f"operators must be a non-empty string of {ALLOWED_OPERATORS!r}, got {operators!r}")
        return cls(operands, _as_range(digits, "digits"), "".join(dict.fromkeys(operators)))


def split_of(expression: str) -> str:
    """The split an expression belongs to (by a hash of its text)."""
    bucket = zlib.crc32(expression.encode()) % 10
    return next(name for name, buckets in _SPLIT_BUCKETS.items() if bucket in buckets)


def _operand(rng: random.Random, digits: tuple[int, int], nonzero: bool) -> int:
    count = rng.randint(*digits)
    low = 10 ** (count - 1) if count > 1 else int(nonzero)
    return rng.randint(low, 10**count - 1)


def generate_task(task_seed: int, difficulty: Difficulty = Difficulty(), split: str = "train") -> dict[str, Any]:
    """The task of ``task_seed`` in ``split``: ``{"question", "answer", "expression", "task_seed", "task_id"}``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(task_seed)
    for _ in range(_MAX_TRIES):
        count = rng.randint(*difficulty.num_operands)
        parts = [str(_operand(rng, difficulty.digits, nonzero=False))]
        for _ in range(count - 1):
            op = rng.choice(difficulty.operators)
            parts += [op, str(_operand(rng, difficulty.digits, nonzero=op == "/"))]
        expression = "".join(parts)
        if split_of(expression) == split:
            return {
                "question": f"What is {expression}?",
                "answer": calculate(expression),
                "expression": expression,
                "task_seed": task_seed,
                "task_id": f"arithmetic-{split}-{task_seed}",
            }
    raise ValueError(f"no {split} task found for seed {task_seed}: the difficulty {difficulty} allows too few expressions")
