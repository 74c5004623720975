"""A small environment whose episode state is all in ``state.data`` (so it snapshots): an ``add`` tool keeps a
tally, slowly when asked (so a test can kill a replica while a step is in flight); the answer earns 1 when it
names the tally; ``breakdown`` fails as the machine would."""

from __future__ import annotations

import asyncio

from forge_env import EpisodeEnd, EpisodeState, InfraError, TextEnv, Tool, Verdict, tool


class TallyEnv(TextEnv):
    supports_snapshots = True

    def __init__(self, delay_s: float = 0.0, **kwargs):
        kwargs.setdefault("max_turns", 10)
        super().__init__(tasks=[{"question": "Add the numbers with the add tool, then answer with the total."}],
                         **kwargs)
        self.delay_s = delay_s

    def episode_tools(self, state: EpisodeState) -> list[Tool]:
        @tool(timeout=30)
        async def add(n: int) -> str:
            """Add a number to the tally.

            Args:
                n: the number to add.
            """
            await asyncio.sleep(self.delay_s)
            state.data["total"] = state.data.get("total", 0) + n
            return str(state.data["total"])

        @tool
        def breakdown() -> str:
            """A tool whose machine fails (an InfraError ends the episode)."""
            raise InfraError("the machine under the tally broke")

        return [add, breakdown]

    async def grade_episode(self, state: EpisodeState, end: EpisodeEnd) -> Verdict | None:
        answer = state.messages[-1].get("content", "") if state.messages else ""
        return Verdict(reward=float(answer.strip() == str(state.data.get("total", 0))))
