"""A plain OpenEnv environment whose actions are MCP tool calls (no forge-env code), served by openenv-core.

Guess a number: ``hint(guess)`` says higher/lower/correct, ``submit(guess)`` ends the episode with
reward 1 if right. Run: ``python -m tests.openenv_guess_server`` (prints its URL when ready).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State


class GuessObservation(Observation):
    prompt: str = ""


class GuessEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        server = FastMCP("guess")
        self.target, self.high, self.steps = 1, 16, 0

        @server.tool
        def hint(guess: int) -> str:
            """Say whether the number is higher or lower than the guess."""
            return "correct" if guess == self.target else "higher" if self.target > guess else "lower"

        @server.tool
        def submit(guess: int) -> str:
            """Submit the final guess."""
            return "right" if guess == self.target else "wrong"

        super().__init__(server)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        rng = random.Random(seed)
        self.high = 8 + rng.randrange(9)
        self.target, self.steps = rng.randint(1, self.high), 0
        return GuessObservation(prompt=f"Guess the number between 1 and {self.high}.")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        return self.reset(seed=seed, episode_id=episode_id)

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        self.steps += 1
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            assert isinstance(observation, CallToolObservation)
            observation.done = True
            observation.reward = 1.0 if action.arguments.get("guess") == self.target else 0.0
        return observation

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return GuessObservation(prompt="only tool calls are actions here", reward=0.0)

    @property
    def state(self) -> State:
        return State(step_count=self.steps)


async def main() -> None:
    app = create_app(GuessEnv, CallToolAction, CallToolObservation, env_name="guess", max_concurrent_envs=8)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    print(f"openenv guess on http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main())
