"""Rubrics: weighted reward functions that score an episode's final answer.

A reward function is a plain or async callable that declares, by parameter name,
which of ``completion`` (the final answer text), ``task``, ``answer`` (the task's
reference answer), ``messages`` (the whole log) and ``state`` it needs. The rubric
calls each one, reports every value as a metric, and sums them with their weights
into the reward (a :class:`~forge_env.core.verdict.Verdict`). A weight of 0 keeps a function as a
metric only. Group functions see all completions of a GRPO group at once (for relative scores).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from forge_env.core.verdict import Verdict

_KNOWN_ARGUMENTS = ("completion", "task", "answer", "messages", "state")


#: The old name of a rubric's result: a :class:`~forge_env.core.verdict.Verdict` whose ``reward`` is the weighted
#: sum and whose ``metrics`` are every function's (unweighted) value, keyed by name.
RubricResult = Verdict


@dataclass
class _RewardFunction:
    name: str
    fn: Callable[..., Any]
    weight: float
    wanted: tuple[str, ...]

    @classmethod
    def wrap(cls, fn: Callable[..., Any], weight: float, name: str | None) -> _RewardFunction:
        params = inspect.signature(fn).parameters
        unknown = [p for p in params if p not in _KNOWN_ARGUMENTS and params[p].default is inspect.Parameter.empty]
        if unknown:
            raise TypeError(
                f"reward function {fn.__name__} asks for {unknown}; it may take any of {_KNOWN_ARGUMENTS}"
            )
        return cls(name or fn.__name__, fn, float(weight), tuple(p for p in params if p in _KNOWN_ARGUMENTS))

    async def call(self, **available: Any) -> Any:
        value = self.fn(**{key: available[key] for key in self.wanted})
        if inspect.isawaitable(value):
            value = await value
        return value


class Rubric:
    """A weighted sum of reward functions; ``score`` returns a :class:`~forge_env.core.verdict.Verdict`."""

    def __init__(self, funcs: Sequence[Callable[..., Any]] = (), weights: Sequence[float] | None = None):
        self._funcs: list[_RewardFunction] = []
        self._group_funcs: list[_RewardFunction] = []
        weights = list(weights) if weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"Rubric got {len(funcs)} functions but {len(weights)} weights")
        for fn, weight in zip(funcs, weights, strict=True):
            self.add(fn, weight)

    def add(self, fn: Callable[..., Any], weight: float = 1.0, name: str | None = None) -> Rubric:
        """Add a per-episode reward function; returns self for chaining."""
        entry = _RewardFunction.wrap(fn, weight, name)
        if any(existing.name == entry.name for existing in self._funcs + self._group_funcs):
            raise ValueError(f"Rubric already has a function named {entry.name!r}; pass name= to tell them apart")
        self._funcs.append(entry)
        return self

    def add_group(self, fn: Callable[..., Any], weight: float = 1.0, name: str | None = None) -> Rubric:
        """Add a group function: it receives lists (``completion=[...]``, ``task=[...]``, ...) and returns one value each."""
        entry = _RewardFunction.wrap(fn, weight, name)
        self._group_funcs.append(entry)
        return self

    @property
    def names(self) -> list[str]:
        return [f.name for f in self._funcs + self._group_funcs]

    async def score(
        self, completion: str, task: dict[str, Any], messages: list | None = None, state: Any = None
    ) -> Verdict:
        """Score one final answer: every function's value as a metric, their weighted sum as the reward."""
        available = {"completion": completion, "task": task, "answer": task.get("answer"),
                     "messages": messages or [], "state": state}
        values = await asyncio.gather(*(f.call(**available) for f in self._funcs))
        metrics = {f.name: float(v) for f, v in zip(self._funcs, values, strict=True)}
        reward = sum(f.weight * metrics[f.name] for f in self._funcs)
        return Verdict(reward=reward, metrics=metrics)

    async def score_group(
        self,
        completions: Sequence[str],
        tasks: Sequence[dict[str, Any]],
        messages: Sequence[list] | None = None,
        states: Sequence[Any] | None = None,
    ) -> list[Verdict]:
        """Score a group: each episode on its own, then the group functions over the whole group."""
        n = len(completions)
        messages = list(messages) if messages is not None else [[] for _ in range(n)]
        states = list(states) if states is not None else [None] * n
        results = list(await asyncio.gather(*(
            self.score(c, t, m, s) for c, t, m, s in zip(completions, tasks, messages, states, strict=True)
        )))
        group_inputs = {"completion": list(completions), "task": list(tasks),
                        "answer": [t.get("answer") for t in tasks], "messages": messages, "state": states}
        for group_fn in self._group_funcs:
            values = list(await group_fn.call(**group_inputs))
            if len(values) != n:
                raise ValueError(f"group function {group_fn.name} returned {len(values)} values for {n} episodes")
            for result, value in zip(results, values, strict=True):
                result.metrics[group_fn.name] = float(value)
                result.reward += group_fn.weight * float(value)
        return results


def attempt_reward_schedule(max_attempts: int, attempt_rewards: Sequence[float] | None = None) -> list[float]:
    """Reward factors of a success at attempt 1, 2, ... for multi-attempt environments (default 1, 0.5, 0.25, ...)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    rewards = list(attempt_rewards) if attempt_rewards is not None else [0.5**k for k in range(max_attempts)]
    if len(rewards) < max_attempts:
        raise ValueError(f"attempt_rewards needs {max_attempts} values (one per attempt), got {len(rewards)}")
    return rewards
