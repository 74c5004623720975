"""``AgentGateway``: episodes of chat calls from an unmodified harness, captured token-exact.

The Python API (usable inside a training app, no HTTP): ``open_episode`` -> ``chat(episode_id, request)``
per call -> ``finish(episode_id, reward=, status=)`` -> the rollout's :class:`~agents.trajectory.Trajectory`.
``agents.gateway.app`` serves the same object over OpenAI's ``/v1/chat/completions``.

Every call of an episode runs in the generator session ``gateway-<episode id>`` (KV reuse); calls of one
episode are serialised. Open episodes are bounded (``max_episodes``); an episode not finished within
``episode_ttl_s`` of its last call is dropped (its session released) and counted in ``stats["expired"]``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from agents.gateway.capture import EpisodeCapture
from agents.gateway.envs import EnvEpisodes
from agents.rollout import episode_status, with_template_stops
from agents.trajectory import STATUS_ERROR, STATUS_INFRA_ERROR, STATUS_OK, Trajectory
from forge_env.generation.base import Generator, SamplingParams
from forge_env.types import Message

#: Episode statuses ``finish`` accepts (the trajectory's).
STATUSES = (STATUS_OK, STATUS_ERROR, STATUS_INFRA_ERROR)
#: Characters an episode id may use (it is part of a URL path), and its longest length.
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
MAX_ID_LENGTH = 128


class GatewayError(ValueError):
    """A call the gateway refuses; ``status`` and ``code`` are the HTTP status and OpenAI error code."""

    status = 400
    code = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EpisodeNotFoundError(GatewayError):
    status = 404
    code = "episode_not_found"


class TooManyEpisodesError(GatewayError):
    status = 429
    code = "too_many_episodes"


class TooManyCallsError(GatewayError):
    status = 429
    code = "too_many_calls"


class ToolChoiceUnmetError(GatewayError):
    """``tool_choice`` asked for a tool call and no sample had one (the last sample is recorded)."""

    status = 422
    code = "tool_choice_unmet"


@dataclass
class GatewayConfig:
    """Limits and defaults of a gateway.

    ``model_name``: the id ``/v1/models`` lists (any ``model`` in a request is accepted and echoed).
    ``max_tokens``: default and ceiling of a call's ``max_tokens``. ``auto_open``: a call to an unknown
    episode id opens it (else ``open_episode`` must come first).
    """

    model_name: str = "forge-env-policy"
    max_episodes: int = 1024
    episode_ttl_s: float | None = 3600.0
    max_tokens: int = 1024
    max_calls_per_episode: int = 1000
    """Calls one episode may make (each history edit holds a whole new prompt: this bounds an episode's tokens)."""
    auto_open: bool = True
    tool_choice_retries: int = 2
    """A ``tool_choice`` ``"required"``/named call whose reply has no (that) tool call is resampled up to this many
    times (rejected samples leave no trace); then the last sample is recorded and the call answers 422."""
    default_sampling: SamplingParams = SamplingParams(temperature=1.0, max_tokens=1024)


@dataclass
class ChatResult:
    """One call's outcome: the assistant message, its sampled ids and logprobs, and the usage numbers."""

    message: Message
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    policy_version: int
    text: str = ""
    """The sampled turn's decoded text (what ``message`` was parsed from)."""


class _Episode:
    def __init__(self, episode_id: str, metadata: dict[str, Any]) -> None:
        self.capture = EpisodeCapture(Trajectory(episode_id=episode_id, task=dict(metadata)))
        self.lock = asyncio.Lock()
        self.started = time.perf_counter()


class AgentGateway:
    """Episodes of OpenAI-style chat calls against ``generator``, rendered by ``renderer`` (a ChatRenderer)."""

    def __init__(self, generator: Generator, renderer: Any, config: GatewayConfig | None = None) -> None:
        self.generator = generator
        self.renderer = renderer
        self.config = config or GatewayConfig()
        self._episodes: dict[str, _Episode] = {}
        self.envs = EnvEpisodes()
        """Environment episodes attached to gateway episodes (``agents.gateway.envs``; the harness's tools)."""
        self.stats: dict[str, int] = {"opened": 0, "finished": 0, "expired": 0, "calls": 0, "history_edits": 0,
                                      "errors": 0, "tool_choice_resamples": 0}

    # ------------------------------------------------------------------ episodes
    @property
    def open_episodes(self) -> list[str]:
        return list(self._episodes)

    def open_episode(self, episode_id: str | None = None, **metadata: Any) -> str:
        """Open an episode (a fresh random id unless given); ``metadata`` lands in ``Trajectory.task``."""
        self.expire()
        episode_id = episode_id or secrets.token_hex(12)
        check_episode_id(episode_id)
        if episode_id in self._episodes:
            raise GatewayError(f"episode {episode_id!r} is already open")
        if len(self._episodes) >= self.config.max_episodes:
            raise TooManyEpisodesError(f"{len(self._episodes)} episodes are open, the limit is "
                                       f"{self.config.max_episodes}; finish some first")
        self._episodes[episode_id] = _Episode(episode_id, metadata)
        self.stats["opened"] += 1
        return episode_id

    def expire(self) -> list[str]:
        """Drop the episodes idle for longer than the TTL (counted in ``stats["expired"]``); returns their ids."""
        ttl = self.config.episode_ttl_s
        if ttl is None:
            return []
        now = time.monotonic()
        gone = [eid for eid, ep in self._episodes.items() if now - ep.capture.last_used > ttl and not ep.lock.locked()]
        for episode_id in gone:
            del self._episodes[episode_id]
            self.stats["expired"] += 1
            self._release_later(episode_id)
            self.envs.drop(episode_id)
        return gone

    def _release_later(self, episode_id: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.create_task(self._release(episode_id))

    async def _release(self, episode_id: str) -> None:
        try:
            await self.generator.release_session(session_id(episode_id))
        except Exception:  # best-effort, as in the rollout: the replica may be gone
            pass

    def _episode(self, episode_id: str) -> _Episode:
        check_episode_id(episode_id)
        episode = self._episodes.get(episode_id)
        if episode is None:
            if not self.config.auto_open:
                raise EpisodeNotFoundError(f"no open episode {episode_id!r}")
            self.open_episode(episode_id)
            episode = self._episodes[episode_id]
        return episode

    async def finish(self, episode_id: str, *, reward: float = 0.0, status: str = STATUS_OK,
                     error: str | None = None, metrics: dict[str, float] | None = None) -> Trajectory:
        """Close ``episode_id``: its trajectory with ``reward`` and ``status`` (one sample per segment)."""
        if status not in STATUSES:
            raise GatewayError(f"status must be one of {STATUSES}, got {status!r}")
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EpisodeNotFoundError(f"no open episode {episode_id!r} (finished, expired or never opened)")
        async with episode.lock:  # a call in flight lands in the trajectory first
            self._episodes.pop(episode_id, None)
        await self._release(episode_id)
        trajectory = episode.capture.trajectory
        trajectory.reward = float(reward)
        trajectory.status = status
        trajectory.error = error if error is not None else trajectory.error
        trajectory.metrics.update(metrics or {})
        trajectory.metrics["gateway_calls"] = float(episode.capture.calls)
        trajectory.total_s = time.perf_counter() - episode.started
        self.stats["finished"] += 1
        return trajectory

    async def aclose(self) -> None:
        """Drop every open episode and release its session (and close any environment attached)."""
        for episode_id in list(self._episodes):
            self._episodes.pop(episode_id, None)
            await self._release(episode_id)
        await self.envs.aclose()

    # ------------------------------------------------------------------ calls
    async def chat(self, episode_id: str, messages: list[Message], *, tools: list[dict] | None = None,
                   sampling: SamplingParams | None = None, tool_choice: Any = None) -> ChatResult:
        """One chat call of ``episode_id``: render, generate in the episode's session, record, answer.

        ``tool_choice`` (OpenAI's): ``"none"`` renders without the tools and returns no tool calls; a named
        function renders only that tool; ``"required"`` and a named function resample a reply without a (that)
        tool call up to ``config.tool_choice_retries`` times (a rejected sample leaves no trace), then record
        the last sample and raise :class:`ToolChoiceUnmetError` (docs/gateway.md).
        """
        self.expire()
        episode = self._episode(episode_id)
        if not messages:
            raise GatewayError("messages must hold at least one message", param="messages")
        shown, wanted = tools_for_choice(tools, tool_choice)
        sampling = with_template_stops(sampling or self.config.default_sampling, self.renderer)
        sampling = replace(sampling, n=1, max_tokens=min(sampling.max_tokens, self.config.max_tokens))
        async with episode.lock:
            if self._episodes.get(episode_id) is not episode:
                raise EpisodeNotFoundError(f"episode {episode_id!r} was finished or expired")
            capture = episode.capture
            capture.last_used = time.monotonic()
            if capture.calls >= self.config.max_calls_per_episode:
                raise TooManyCallsError(f"episode {episode_id!r} made {capture.calls} calls, the limit is "
                                        f"{self.config.max_calls_per_episode}; finish it")
            attempts = 1 + (self.config.tool_choice_retries if wanted is not None else 0)
            for attempt in range(attempts):
                state = capture.checkpoint()
                try:
                    prompt = capture.prompt(self.renderer, messages, shown)
                    t0 = time.perf_counter()
                    completion = await self.generator.generate(prompt, sampling, session_id=session_id(episode_id))
                except BaseException as exc:  # the call leaves no trace: a harness may retry it as it was
                    capture.restore(state)
                    self.stats["errors"] += 1
                    if isinstance(exc, Exception) and episode_status(exc) == STATUS_INFRA_ERROR:
                        capture.trajectory.status = STATUS_INFRA_ERROR
                        capture.trajectory.error = f"{type(exc).__name__}: {exc}"
                    raise
                generation_s = time.perf_counter() - t0
                text = self.renderer.decode_assistant(completion.token_ids)
                reply = self.renderer.parse_assistant(text)
                met = wanted is None or any(wanted in ("", (c.get("function") or {}).get("name"))
                                            for c in reply.get("tool_calls") or [])
                if met or attempt + 1 == attempts:
                    break
                capture.restore(state)  # rejected: resampled, never trained on
                self.stats["tool_choice_resamples"] += 1
                capture.trajectory.metrics["tool_choice_resamples"] = (
                    capture.trajectory.metrics.get("tool_choice_resamples", 0.0) + 1)
            self.stats["history_edits"] += len(capture.trajectory.segment_starts) - len(state[1])
            if tool_choice == "none" and reply.get("tool_calls"):
                reply = {"role": "assistant", "content": text}  # the sampled text, its calls not offered
            if reply.get("tool_calls"):
                reply["content"] = reply.get("content") or None  # type: ignore[typeddict-item]
            capture.record(completion, reply, text, messages, generation_s)
            self.stats["calls"] += 1
        if not met:
            raise ToolChoiceUnmetError(
                f"tool_choice asked for {'a call of ' + repr(wanted) if wanted else 'a tool call'} and the model's "
                f"reply has none after {attempts} sample(s); the reply is recorded, the next call of this history "
                f"starts a new segment", param="tool_choice")
        finish = completion.finish_reason
        finish = "tool_calls" if reply.get("tool_calls") and finish == "stop" else finish
        return ChatResult(message=reply, token_ids=list(completion.token_ids), logprobs=list(completion.logprobs),
                          finish_reason="stop" if finish == "abort" else finish, prompt_tokens=len(prompt),
                          cached_tokens=completion.num_cached_tokens, policy_version=completion.policy_version,
                          text=text)


def tools_for_choice(tools: list[dict] | None, tool_choice: Any) -> tuple[list[dict] | None, str | None]:
    """(the tools the template is given, the function a reply must call: ``""`` any, None no requirement)."""
    if tool_choice in (None, "auto"):
        return tools, None
    if tool_choice == "none":
        return None, None
    if not tools:
        raise GatewayError("tool_choice asks for a tool call but the request has no tools", param="tool_choice")
    if tool_choice == "required":
        return tools, ""
    name = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
    chosen = [t for t in tools if (t.get("function") or {}).get("name") == name]
    if not isinstance(name, str) or not chosen:
        raise GatewayError(f"tool_choice names the function {name!r}, which is not among the tools",
                           param="tool_choice")
    return chosen, name


def session_id(episode_id: str) -> str:
    """The generator session of an episode."""
    return f"gateway-{episode_id}"


def check_episode_id(episode_id: str) -> None:
    if not episode_id or len(episode_id) > MAX_ID_LENGTH or not set(episode_id) <= _ID_CHARS:
        raise GatewayError(f"an episode id is 1 to {MAX_ID_LENGTH} of [A-Za-z0-9._-]; got {episode_id[:40]!r}")
