"""Environment episodes behind gateway episodes: a harness's actions run in a forge-env ``TextEnv``, and the
environment grades the episode when the trainer finishes it.

``gateway.envs.attach(episode_id, env, seed=...)`` resets ``env`` (e.g. SWE-v0: a workspace with the task's
checkout) for a gateway episode. The harness runs the environment's tools through
``POST /e/{episode_id}/env/tools/{name}`` (the harness's bearer token; mini-swe-agent does it with
``agents.gateway.mini_swe.GatewayEnvironment``): each call is one ``env.astep`` with that tool call, so it takes
the tool's own path (SWE-v0's ``bash``: the workspace's sandbox session), counts as a turn and is bounded by the
environment's limits. ``finish(episode_id)`` is the trainer's: the episode's final answer is stepped (SWE-v0 grades
the workspace then), the environment's episode is closed (SWE-v0: the workspace is removed) and the reward is the
episode's return. The harness never sees a reward and cannot end the grading itself except by a tool the
environment offers for it (SWE-v0's ``submit``, graded the same way).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from forge_env.errors import InfraError
from forge_env.types import Message, assistant_message, make_tool_call

#: The final answer stepped when the trainer finishes an episode (an environment grading the answer's text, e.g.
#: Math-v0, gets the harness's answer through ``finish(answer=...)``; an empty answer would be a format error).
FINAL_ANSWER = "(the harness has finished)"


class EnvEpisodeError(ValueError):
    """A tool call the environment's episode cannot take (no such episode or tool, the episode has ended)."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


@dataclass
class EnvOutcome:
    """How the environment judged an episode: its return, metrics and summary; ``graded`` is False when it had
    already ended without grading (truncated by its limits) or was closed without grading."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    graded: bool = False
    truncated: bool = False
    infra_error: str | None = None
    """An InfraError of the environment (a sandbox that could not run): the episode is not trained on."""


class _Attached:
    def __init__(self, env: Any, opening: list[Message], info: dict[str, Any]) -> None:
        self.env = env
        self.opening = opening
        self.tools: dict[str, dict[str, Any]] = {spec["function"]["name"]: spec for spec in info.get("tools", [])}
        self.info = info
        self.lock = asyncio.Lock()
        self.last_info: dict[str, Any] = {}
        self.truncated = False
        self.terminated = False
        self.infra_error: str | None = None
        self.calls = 0


class EnvEpisodes:
    """The environment episodes attached to gateway episodes (one ``TextEnv`` instance per episode)."""

    def __init__(self) -> None:
        self._episodes: dict[str, _Attached] = {}

    def __contains__(self, episode_id: str) -> bool:
        return episode_id in self._episodes

    async def attach(self, episode_id: str, env: Any, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> list[Message]:
        """Reset ``env`` for ``episode_id``; returns its opening messages (the task)."""
        if episode_id in self._episodes:
            raise EnvEpisodeError(f"episode {episode_id!r} already has an environment")
        opening, info = await env.areset(seed=seed, options=options)
        self._episodes[episode_id] = _Attached(env, opening, info)
        return opening

    def describe(self, episode_id: str) -> dict[str, Any]:
        """What a harness may ask: the opening messages and the tools' specs."""
        attached = self._get(episode_id)
        return {"messages": attached.opening, "tools": list(attached.tools.values())}

    def _get(self, episode_id: str) -> _Attached:
        attached = self._episodes.get(episode_id)
        if attached is None:
            raise EnvEpisodeError(f"episode {episode_id!r} has no environment", status=404, code="not_found")
        return attached

    async def call_tool(self, episode_id: str, name: str, arguments: Any) -> dict[str, Any]:
        """One tool call as one environment step: ``{"output", "error", "done"}``."""
        attached = self._get(episode_id)
        if name not in attached.tools:
            raise EnvEpisodeError(f"the environment has no tool {name!r} (it has {sorted(attached.tools)})",
                                  status=404, code="unknown_tool", param="tool")
        if not isinstance(arguments, dict):
            raise EnvEpisodeError("the body must be a JSON object of the tool's arguments", param="arguments")
        async with attached.lock:
            state = attached.env.state
            if self._episodes.get(episode_id) is not attached or state is None or state.done:
                why = f"truncated: {attached.last_info.get('truncation_reason')}" if attached.truncated else "finished"
                raise EnvEpisodeError(f"the environment's episode has ended ({why}); no more actions", status=409,
                                      code="episode_ended")
            try:
                observation, _, terminated, truncated, info = await attached.env.astep(
                    assistant_message("", [make_tool_call(name, arguments)]))
            except InfraError as exc:
                attached.infra_error = f"{type(exc).__name__}: {exc}"
                raise
            attached.calls += 1
            attached.last_info = info
            attached.truncated = attached.truncated or truncated
            attached.terminated = attached.terminated or terminated
        output = "\n".join(str(m.get("content") or "") for m in observation)
        return {"output": output, "error": bool(info.get("errors")), "done": bool(terminated or truncated)}

    async def finish(self, episode_id: str, *, grade: bool = True, answer: str = FINAL_ANSWER) -> EnvOutcome:
        """Close the environment's episode: grade it (its final answer ``answer``) unless it has ended already or
        ``grade`` is False, release its resources, and return the outcome."""
        attached = self._get(episode_id)
        async with attached.lock:  # a tool call in flight ends first
            self._episodes.pop(episode_id, None)
            env = attached.env
            info = attached.last_info
            graded = attached.terminated  # a tool that ends the episode (SWE-v0's submit) graded it
            try:
                if grade and attached.infra_error is None and env.state is not None and not env.state.done:
                    _, _, terminated, truncated, info = await env.astep({"role": "assistant", "content": answer})
                    attached.truncated = attached.truncated or truncated
                    graded = terminated
            except InfraError as exc:
                attached.infra_error = f"{type(exc).__name__}: {exc}"
            finally:
                await env.aclose()
        state = env.state
        return EnvOutcome(reward=float(state.total_reward) if state is not None else 0.0,  # the episode's return
                          metrics=dict(state.metrics) if state is not None else {},
                          summary=dict(info.get("episode_summary") or {}), graded=graded,
                          truncated=attached.truncated, infra_error=attached.infra_error)

    def drop(self, episode_id: str) -> None:
        """Close an episode's environment without grading (its gateway episode expired), in the background."""
        attached = self._episodes.pop(episode_id, None)
        if attached is None:
            return
        try:
            asyncio.get_running_loop().create_task(_close(attached))
        except RuntimeError:
            pass

    async def aclose(self) -> None:
        for episode_id in list(self._episodes):
            attached = self._episodes.pop(episode_id)
            await _close(attached)


async def _close(attached: _Attached) -> None:
    async with attached.lock:
        try:
            await attached.env.aclose()
        except Exception:  # best-effort: the episode is dropped either way
            pass
