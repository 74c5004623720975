"""The agent rollout loop: one episode of a generator against an environment.

Per turn: generate within the episode's sticky session (so the generator reuses the
KV cache of earlier turns), hand the sampled text to the env, and render only the
env's reply onto the token list, so the conversation's tokens only ever grow and the
sampled tokens stay verbatim. After each reply the renderer checks the tokens against a full re-render
of the conversation (``ChatRenderer.check_drift``) and each new divergence is recorded in
``Trajectory.drift``; where the template drops earlier reasoning and the renderer was built with
``reasoning="rerender"``, the next prompt is the re-render instead (a new context segment). The env can be a local ``TextEnv`` or a ``RemoteEnv``
(same async API). An error in the env or the generator ends that episode with an
error status; it never propagates to other episodes. A failure of the machine rather
than the policy (any :class:`~forge_env.errors.InfraError`: a lost replica, a sandbox that
broke, a tool held up past its deadline; or an env that does not answer within ``step_timeout_s``)
gets the status ``infra_error``, so training never learns a 0 from it (its group is refilled or dropped whole: ``rollout.lost_episodes``). A model
endpoint that failed for good (``EndpointError``, an ``InfraError`` too) keeps ``status="error"``
with ``error_kind="endpoint"``, which evaluation counts apart. With a chat template without tool support the
trajectory's messages are recorded as the template saw them (:func:`template_trajectory_messages`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Protocol

from agents.trajectory import ERROR_INTERNAL, STATUS_ERROR, STATUS_INFRA_ERROR, Trajectory, Turn
from forge_env.chat_drift import REASONING_DROPPED
from forge_env.core.remote import AsyncEnv  # what the loop needs of an environment (defined once, in the SDK)
from forge_env.errors import InfraError
from forge_env.generation.base import Completion, Generator, SamplingParams
from forge_env.generation.endpoints.config import EndpointError
from forge_env.types import Message

#: Truncation reasons recorded on trajectories (besides the env's own, e.g. ``max_turns``).
TRUNCATED_MAX_TOKENS = "max_tokens"
TRUNCATED_PROMPT_TOO_LONG = "prompt_too_long"
TRUNCATED_ENV_TIMEOUT = "env_timeout"
TRUNCATED_GENERATION_LENGTH = "generation_length"
TRUNCATED_DEADLINE = "deadline"
TRUNCATED_MAX_TURNS = "max_turns"



class Renderer(Protocol):
    """What the loop needs of a chat renderer (``forge_env.chat.ChatRenderer`` fits)."""

    def render_prompt(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]: ...

    def render_continuation(self, token_ids: list[int], new_messages: list[Message],
                            tools: list[dict] | None = None) -> list[int]: ...

    def decode_assistant(self, sampled_ids: list[int]) -> str: ...


@dataclass
class EpisodeBudget:
    """Limits of one episode. ``None`` means no limit of that kind."""

    max_turns: int | None = None
    max_total_tokens: int | None = None
    max_prompt_tokens: int | None = None
    step_timeout_s: float | None = None
    deadline_s: float | None = None


async def run_episode(
    env: AsyncEnv,
    generator: Generator,
    renderer: Renderer,
    *,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    task: dict[str, Any] | None = None,
    budget: EpisodeBudget | None = None,
    episode_id: str | None = None,
    group_id: str = "",
    env_id: str = "",
) -> Trajectory:
    """Play one episode and return its token-exact :class:`Trajectory` (never raises for env/generator errors).

    ``task`` runs that exact task (``reset(options={"task": task})``); otherwise the env draws one with
    ``seed``. Each turn's ``max_tokens`` shrinks to what ``budget.max_total_tokens`` leaves.
    """
    sampling = with_template_stops(sampling or SamplingParams(), renderer)
    budget = budget or EpisodeBudget()
    episode_id = episode_id or uuid.uuid4().hex[:12]
    trajectory = Trajectory(episode_id=episode_id, env_id=env_id, group_id=group_id, seed=seed)
    started = time.perf_counter()
    deadline = started + budget.deadline_s if budget.deadline_s is not None else None
    session_id = f"episode-{episode_id}"
    try:
        await _play(env, generator, renderer, sampling, seed, task, budget, deadline, session_id, trajectory)
    except Exception as exc:  # one broken episode must not take its group down
        trajectory.status = episode_status(exc)
        trajectory.error = f"{type(exc).__name__}: {exc}"
        # An endpoint that failed for good is not a model failure: eval counts it apart (see EndpointError).
        trajectory.error_kind = getattr(exc, "error_kind", ERROR_INTERNAL)
        trajectory.endpoint_retries += int(getattr(exc, "retries", 0) or 0)
    finally:
        template_trajectory_messages(renderer, trajectory)
        try:
            await generator.release_session(session_id)
        except Exception:  # releasing a cache is best-effort: the replica may be gone
            pass
        trajectory.total_s = time.perf_counter() - started
    return trajectory


def episode_status(exc: BaseException) -> str:
    """The status of an episode ``exc`` ended: ``infra_error`` for a failure of the machine (an ``InfraError``),
    else ``error``. A failed model endpoint is an ``InfraError`` but keeps ``error`` (with ``error_kind="endpoint"``):
    evaluation counts those episodes apart (see ``EndpointError``)."""
    if isinstance(exc, InfraError) and not isinstance(exc, EndpointError):
        return STATUS_INFRA_ERROR
    return STATUS_ERROR


async def _play(env: AsyncEnv, generator: Generator, renderer: Renderer, sampling: SamplingParams,
                seed: int | None, task: dict[str, Any] | None, budget: EpisodeBudget, deadline: float | None,
                session_id: str, trajectory: Trajectory) -> None:
    observation, tools = await reset_env(env, seed, task, budget, deadline, trajectory)
    prompt_start = 0
    trajectory.append_context(renderer.render_prompt(list(observation), tools))

    while True:
        if budget.max_turns is not None and len(trajectory.turns) >= budget.max_turns:
            return truncate_trajectory(trajectory, TRUNCATED_MAX_TURNS)
        if budget.max_prompt_tokens is not None and len(trajectory.context_ids) > budget.max_prompt_tokens:
            return truncate_trajectory(trajectory, TRUNCATED_PROMPT_TOO_LONG)
        max_tokens = sampling.max_tokens
        if budget.max_total_tokens is not None:
            max_tokens = min(max_tokens, budget.max_total_tokens - len(trajectory.context_ids))
            if max_tokens <= 0:
                return truncate_trajectory(trajectory, TRUNCATED_MAX_TOKENS)
        if deadline is not None and time.perf_counter() >= deadline:
            return truncate_trajectory(trajectory, TRUNCATED_DEADLINE)

        t0 = time.perf_counter()
        # Each turn draws from its own stream: reusing the episode's seed every turn would correlate them.
        turn_sampling = replace(sampling.derived("turn", len(trajectory.turns)), max_tokens=max_tokens, n=1)
        completion: Completion = await generator.generate(trajectory.context_ids, turn_sampling,
                                                          session_id=session_id)
        generation_s = time.perf_counter() - t0
        trajectory.endpoint_retries += int(completion.metrics.get("retries", 0))
        gen_start = len(trajectory.token_ids)
        trajectory.append_sampled(completion.token_ids, completion.logprobs)
        turn = Turn(prompt_start=prompt_start, gen_start=gen_start, gen_end=len(trajectory.token_ids),
                    policy_version=completion.policy_version, finish_reason=completion.finish_reason,
                    num_cached_tokens=completion.num_cached_tokens, generation_s=generation_s)
        trajectory.turns.append(turn)
        trajectory.generation_s += generation_s
        text = renderer.decode_assistant(completion.token_ids)
        trajectory.messages.append({"role": "assistant", "content": text})
        if completion.finish_reason == "length":
            # The turn was cut mid-way; its text is not a real action, so the env never sees it.
            reason = TRUNCATED_MAX_TOKENS if max_tokens < sampling.max_tokens else TRUNCATED_GENERATION_LENGTH
            return truncate_trajectory(trajectory, reason)

        observation = await step_env(env, text, budget, deadline, trajectory, turn)
        if observation is None:
            return None
        context = trajectory.context_ids
        continuation = renderer.render_continuation(context, list(observation), tools)
        new_segment = check_drift_into(renderer, trajectory, context + continuation, tools)
        if new_segment is not None:
            continuation = new_segment
        if budget.max_total_tokens is not None and len(
                continuation if new_segment is not None else context + continuation) >= budget.max_total_tokens:
            # The env's reply would leave no room for another turn: the tokens stop at the last sampled turn.
            return truncate_trajectory(trajectory, TRUNCATED_MAX_TOKENS)
        prompt_start = len(trajectory.token_ids)
        if new_segment is not None:
            trajectory.start_segment(new_segment)
        else:
            trajectory.append_context(continuation)


def check_drift_into(renderer: Renderer, trajectory: Trajectory, context: list[int], tools: list[dict],
                 messages: list[Message] | None = None) -> list[int] | None:
    """Record where ``context`` (the next prompt) differs from the template's render of the conversation
    (``messages`` of the current segment; default: the trajectory's).

    Returns the re-rendered prompt when the renderer re-renders dropped reasoning (a new segment), else None.
    """
    check = getattr(renderer, "check_drift", None)
    if check is None:
        return None
    messages = trajectory.messages if messages is None else messages
    drift = check(context, messages, tools)
    if drift is None:
        return None
    if drift.kind == REASONING_DROPPED and getattr(renderer, "reasoning", "keep") == "rerender":
        return renderer.rerender(messages, tools)  # type: ignore[attr-defined]
    trajectory.record_drift(drift, offset=trajectory.segment_starts[-1])
    return None


def template_trajectory_messages(renderer: Renderer, trajectory: Trajectory) -> None:
    """Store ``trajectory.messages`` as the chat template saw them, where it has no tool support.

    A template without tool support (``renderer.support.none``, :mod:`forge_env.chat_tools`) renders neither
    ``tools=`` nor structured calls, so the episode's messages get the tool listing in their system message (and
    tool results as the template renders them), via the renderer's idempotent ``template_messages``: the
    tokenizer's own ``apply_chat_template(trajectory.messages)`` then reproduces the trajectory's tokens (the rule
    is in docs/generation.md). A template with tool support, or a renderer that does not say, is left alone:
    its messages stay the env's, rendered with ``tools=trajectory.tools``.
    """
    support = getattr(renderer, "support", None)
    if getattr(support, "none", False) is not True or not trajectory.messages:
        return
    try:
        trajectory.messages = renderer.template_messages(trajectory.messages, trajectory.tools)[0]  # type: ignore[attr-defined]
    except Exception:  # a tool format it cannot write already ended the episode in an error: keep the env's
        pass


def with_template_stops(sampling: SamplingParams, renderer: Renderer) -> SamplingParams:
    """Stop also at the template's end-of-turn tokens (gpt-oss's ``<|call|>`` is not its eos token)."""
    extra = [i for i in getattr(renderer, "stop_token_ids", ()) if i not in sampling.stop_token_ids]
    return replace(sampling, stop_token_ids=(*sampling.stop_token_ids, *extra)) if extra else sampling


async def reset_env(env: AsyncEnv, seed: int | None, task: dict[str, Any] | None, budget: EpisodeBudget,
                    deadline: float | None, trajectory: Trajectory) -> tuple[list[Message], list[dict]]:
    """Reset ``env`` (on ``task`` if given) into ``trajectory``; returns the opening messages and the tools."""
    turn_time = getattr(env, "turn_tool_time_s", None)
    if budget.step_timeout_s is not None and turn_time is not None and turn_time >= budget.step_timeout_s:
        # A step may run tools for turn_time seconds: a shorter step timeout would mask a slow turn (the
        # policy's doing) as the machine's failure.
        raise ValueError(f"step_timeout_s ({budget.step_timeout_s:g} s) must exceed the env's turn_tool_time_s "
                         f"({turn_time:g} s, the tool time one step may take); raise the one or lower the other")
    t0 = time.perf_counter()
    observation, info = await _bounded(env.areset(seed=seed, options={"task": task} if task is not None else None),
                                       budget.step_timeout_s, deadline)
    trajectory.env_s += time.perf_counter() - t0
    tools = info.get("tools") or []
    trajectory.tools = tools
    trajectory.task = task if task is not None else info.get("task", {})
    trajectory.messages.extend(observation)
    return list(observation), tools


async def step_env(env: AsyncEnv, action: Any, budget: EpisodeBudget, deadline: float | None,
                   trajectory: Trajectory, turn: Turn) -> list[Message] | None:
    """Hand the assistant's ``action`` to ``env`` and record the outcome on ``trajectory`` and ``turn``.

    Returns the env's reply, or ``None`` when the episode ended (terminated, truncated, or the env timed out).
    """
    t0 = time.perf_counter()
    try:
        observation, reward, terminated, truncated, info = await _bounded(
            env.astep(action), budget.step_timeout_s, deadline)
    except TimeoutError:
        trajectory.env_s += time.perf_counter() - t0
        if deadline is not None and time.perf_counter() >= deadline:
            truncate_trajectory(trajectory, TRUNCATED_DEADLINE)  # the episode's own time budget ran out
            return None
        # The env's tools have their own timeouts; an env that does not answer at all is the machine's fault.
        trajectory.status = STATUS_INFRA_ERROR
        trajectory.error = f"the environment did not answer a step within {budget.step_timeout_s} s"
        truncate_trajectory(trajectory, TRUNCATED_ENV_TIMEOUT)
        return None
    turn.env_s = time.perf_counter() - t0
    trajectory.env_s += turn.env_s
    turn.reward = float(reward)
    trajectory.reward += float(reward)
    trajectory.messages.extend(observation)
    trajectory.metrics.update(info.get("metrics", {}))
    if info.get("resumed"):  # the env's replica was lost and the episode resumed on another (durable sessions)
        trajectory.metrics["env_resumes"] = trajectory.metrics.get("env_resumes", 0.0) + 1.0
        trajectory.metrics["env_resumed_from_turn"] = float(info["resumed"].get("from_turn", -1))
    if terminated or truncated:
        trajectory.terminated = bool(terminated)
        trajectory.truncated = bool(truncated)
        trajectory.truncation_reason = info.get("truncation_reason") if truncated else None
        if "episode_summary" in info:
            # the numbers of the summary (SWE-v0's also holds text: "2/3" tests passed, who judged)
            trajectory.metrics.update({f"episode_{k}": float(v) for k, v in info["episode_summary"].items()
                                       if isinstance(v, (int, float))})
        return None
    return list(observation)


def truncate_trajectory(trajectory: Trajectory, reason: str) -> None:
    trajectory.truncated = True
    trajectory.truncation_reason = reason


async def _bounded(awaitable: Any, timeout: float | None, deadline: float | None) -> Any:
    """Await with the tighter of a per-step timeout and the episode deadline."""
    limits = [t for t in (timeout, None if deadline is None else deadline - time.perf_counter()) if t is not None]
    if not limits:
        return await awaitable
    return await asyncio.wait_for(awaitable, max(min(limits), 0.0))
