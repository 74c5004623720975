"""``rollout.source: gateway``: a training round's episodes are runs of an unmodified harness against the agent
gateway (docs/gateway.md), rewarded by the function ``rollout.gateway.reward`` names, or, with ``reward: env``,
by the environment of the ``env`` section: each episode gets an instance of it reset with the task's seed (made
in this process, whatever ``env.service`` says), the harness runs its tools through the gateway
(``agents.gateway.envs``; mini-swe-agent with ``agents.gateway.mini_swe.GatewayEnvironment``) and the environment
grades the episode when the harness has finished (SWE-v0: the workspace as the harness left it).

The gateway serves the loop's own generator and renderer on 127.0.0.1 (started with the first round); each
GRPO group runs the harness command ``group_size`` times with the group's task seed (``{seed}``), at most
``rollout.max_episodes_in_flight`` processes at a time. The trajectories carry the group id, so advantages are
group-relative as with the env source.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from agents.gateway.core import AgentGateway, GatewayConfig
from agents.gateway.harness import HarnessSpec, RewardFn, run_harness
from agents.groups import GroupRequest, with_refills
from agents.train.config import ENV_REWARD, GRPOConfig
from agents.trajectory import Trajectory
from forge_env.generation.base import SamplingParams


def gateway_source_for(config: GRPOConfig, components: Any) -> GatewaySource | None:
    """The loop's gateway source (its closer registered with the components), or None for ``source: env``."""
    if config.rollout.source != "gateway":
        return None
    source = GatewaySource(config, components.generator, components.renderer)
    components.add_closer(source.close)
    return source


def load_reward(name: str) -> RewardFn:
    """The function ``module:function`` names."""
    module, _, attribute = name.partition(":")
    try:
        function = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"rollout.gateway.reward {name!r} names no function: {exc}") from None
    if not callable(function):
        raise ValueError(f"rollout.gateway.reward {name!r} is not callable")
    return function


class GatewaySource:
    """Plays rounds through the gateway; ``close`` stops its server."""

    def __init__(self, config: GRPOConfig, generator: Any, renderer: Any) -> None:
        source = config.rollout.gateway
        self.spec = HarnessSpec(command=source.command, timeout_s=source.timeout_s)
        # ``reward: env``: the config's env grades each episode; one instance per episode in flight, reused
        self.reward = None if source.reward == ENV_REWARD else load_reward(source.reward)
        self.env_config = config.env if self.reward is None else None
        self._idle_envs: list[Any] = []
        self.limit = asyncio.Semaphore(config.rollout.max_episodes_in_flight)
        self.lost_episodes = config.rollout.lost_episodes_policy()
        self.gateway = AgentGateway(generator, renderer, GatewayConfig(
            max_episodes=config.rollout.max_episodes_in_flight, max_tokens=config.rollout.sampling.max_tokens))
        self.server: Any = None
        self.env_id = f"gateway:{source.command.split()[0]}" if source.command.split() else "gateway"

    async def play(self, requests: list[GroupRequest], sampling: SamplingParams) -> list[Trajectory]:
        if self.server is None:
            from agents.gateway.app import GatewayServer  # FastAPI and uvicorn load only for this source

            self.server = await GatewayServer(self.gateway).start()
        # A harness's own sampling values win; the round's are the defaults (its seed is the round's base seed).
        self.gateway.config.default_sampling = replace(sampling, n=1)

        async def episode(request: GroupRequest) -> Trajectory:
            async with self.limit:
                env = self._take_env()
                try:
                    trajectory = await run_harness(self.gateway, self.server, self.spec, self.reward, env=env,
                                                   env_seed=request.seed,
                                                   seed=request.seed if request.seed is not None else 0,
                                                   group_id=request.group_id)
                finally:
                    if env is not None:
                        self._idle_envs.append(env)
            trajectory.group_id, trajectory.seed, trajectory.env_id = request.group_id, request.seed, self.env_id
            return trajectory

        # An episode the machine spoiled is played again as rollout.lost_episodes says (agents.groups).
        budgets = {id(r): self.lost_episodes.budget() for r in requests}
        runs = await asyncio.gather(*(with_refills(lambda r=r: episode(r), budgets[id(r)])
                                      for r in requests for _ in range(r.n)))
        return [t for attempts in runs for t in attempts]

    async def groups(self, requests: list[GroupRequest], sampling: SamplingParams) -> AsyncIterator[list[Trajectory]]:
        """The round's harness runs (:meth:`play`), as the loop takes env episodes: one list per group."""
        by_group: dict[str, list[Trajectory]] = {}
        for trajectory in await self.play(requests, sampling):
            by_group.setdefault(trajectory.group_id, []).append(trajectory)
        for group in by_group.values():
            yield group

    def _take_env(self) -> Any:
        if self.env_config is None:
            return None
        if self._idle_envs:
            return self._idle_envs.pop()
        import forge_env

        return forge_env.make(self.env_config.id, **self.env_config.kwargs)

    async def close(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None
        await self.gateway.aclose()
        for env in self._idle_envs:
            await env.aclose()
        self._idle_envs.clear()
