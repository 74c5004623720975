"""Message-level episodes: an environment played through a chat API (``/v1/chat/completions``).

The endpoint renders the conversation with its own template and returns the assistant message with tool calls
already structured, which goes to the env as it is. The trajectory keeps the messages, rewards, turns and the
API's token usage, and says ``level="message"``: it has no token ids or loss mask, so it is for evaluation
only (``Trajectory.to_sample`` and the replay buffer refuse it). Endpoint failures end the episode with
``status="error"``, ``error_kind="endpoint"``, as in the token-level loop.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any, Protocol

from agents.rollout import (
    TRUNCATED_DEADLINE,
    TRUNCATED_GENERATION_LENGTH,
    TRUNCATED_MAX_TURNS,
    EpisodeBudget,
    reset_env,
    step_env,
    truncate_trajectory,
)
from agents.trajectory import ERROR_INTERNAL, LEVEL_MESSAGE, STATUS_ERROR, Trajectory, Turn
from forge_env.core.remote import AsyncEnv
from forge_env.generation.base import SamplingParams
from forge_env.types import Message


class ChatClient(Protocol):
    """What the loop needs of a chat endpoint (``forge_env.generation.endpoints.ChatEndpoint`` fits)."""

    async def chat(self, messages: list[Message], tools: list[dict] | None = None,
                   sampling: SamplingParams | None = None, session_id: str | None = None) -> Any: ...


async def run_message_episode(env: AsyncEnv, client: ChatClient, *, sampling: SamplingParams | None = None,
                              seed: int | None = None, task: dict[str, Any] | None = None,
                              budget: EpisodeBudget | None = None, episode_id: str | None = None,
                              group_id: str = "", env_id: str = "") -> Trajectory:
    """Play one episode through ``client`` and return its message-level :class:`Trajectory` (never raises)."""
    sampling = sampling or SamplingParams()
    budget = budget or EpisodeBudget()
    episode_id = episode_id or uuid.uuid4().hex[:12]
    trajectory = Trajectory(episode_id=episode_id, env_id=env_id, group_id=group_id, seed=seed, level=LEVEL_MESSAGE,
                            usage={"prompt_tokens": 0, "completion_tokens": 0})
    started = time.perf_counter()
    deadline = started + budget.deadline_s if budget.deadline_s is not None else None
    try:
        await _play(env, client, sampling, seed, task, budget, deadline, f"episode-{episode_id}", trajectory)
    except Exception as exc:  # one broken episode must not take the run down
        trajectory.status = STATUS_ERROR
        trajectory.error = f"{type(exc).__name__}: {exc}"
        trajectory.error_kind = getattr(exc, "error_kind", ERROR_INTERNAL)
        trajectory.endpoint_retries += int(getattr(exc, "retries", 0) or 0)
    finally:
        trajectory.total_s = time.perf_counter() - started
    return trajectory


async def _play(env: AsyncEnv, client: ChatClient, sampling: SamplingParams, seed: int | None,
                task: dict[str, Any] | None, budget: EpisodeBudget, deadline: float | None, session_id: str,
                trajectory: Trajectory) -> None:
    _, tools = await reset_env(env, seed, task, budget, deadline, trajectory)
    while True:
        if budget.max_turns is not None and len(trajectory.turns) >= budget.max_turns:
            return truncate_trajectory(trajectory, TRUNCATED_MAX_TURNS)
        if deadline is not None and time.perf_counter() >= deadline:
            return truncate_trajectory(trajectory, TRUNCATED_DEADLINE)
        t0 = time.perf_counter()
        reply = await client.chat(list(trajectory.messages), tools, replace(sampling, n=1), session_id=session_id)
        turn = Turn(prompt_start=0, gen_start=0, gen_end=0, policy_version=0, finish_reason=reply.finish_reason,
                    generation_s=time.perf_counter() - t0)
        trajectory.turns.append(turn)
        trajectory.generation_s += turn.generation_s
        trajectory.endpoint_retries += reply.retries
        trajectory.usage["prompt_tokens"] += reply.prompt_tokens
        trajectory.usage["completion_tokens"] += reply.completion_tokens
        trajectory.messages.append(reply.message)
        if reply.finish_reason == "length" and not reply.message.get("tool_calls"):
            return truncate_trajectory(trajectory, TRUNCATED_GENERATION_LENGTH)
        if await step_env(env, reply.message, budget, deadline, trajectory, turn) is None:
            return None
