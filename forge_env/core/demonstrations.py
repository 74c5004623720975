"""Expert demonstrations: play an environment's own expert to the end and keep the episode as SFT data.

An environment with an expert has ``expert_action(observation)`` returning the ideal next
assistant turn. :func:`demonstrate` plays one episode with it and returns
``{"messages": [...], "tools": [...], "task": {...}}`` (the "messages"/"tools" layout of
chat SFT datasets), raising if the expert does not earn full reward.
"""

from __future__ import annotations

from typing import Any, Protocol

from forge_env.core.env import EpisodeState
from forge_env.core.remote import AsyncEnv
from forge_env.types import Message


class ExpertEnv(AsyncEnv, Protocol):
    """A text environment (an :class:`~forge_env.core.remote.AsyncEnv`) with an expert policy."""

    state: EpisodeState | None

    def expert_action(self, observation: Any = None) -> Message | str: ...


class ExpertFailedError(RuntimeError):
    """The expert did not earn full reward on a task (a bug in the expert or the environment)."""


async def demonstrate(env: ExpertEnv, *, seed: int | None = None, task: dict[str, Any] | None = None,
                      full_reward: float = 1.0) -> dict[str, Any]:
    """Play the expert on the task drawn with ``seed`` (or on ``task``); return the episode as an SFT example."""
    observation, info = await env.areset(seed=seed, options={"task": task} if task is not None else None)
    done, reward = False, 0.0
    while not done:
        observation, reward, terminated, truncated, _ = await env.astep(env.expert_action(observation))
        done = terminated or truncated
    assert env.state is not None
    if reward != full_reward:
        raise ExpertFailedError(f"the expert earned {reward}, not {full_reward}, on task "
                                f"{env.state.task.get('task_id', env.state.task)!r}: {env.state.messages}")
    return {"messages": [dict(m) for m in env.state.messages], "tools": info["tools"], "task": env.state.task}
