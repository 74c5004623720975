"""check_env catches environments that break the contract."""

import numpy as np
import pytest

from forge_env import EnvCheckError, TextEnv, Verdict, check_env
from tests.guess_env import GuessEnv


class IgnoresSeed(GuessEnv):
    def sample_task(self, rng):
        return {"question": f"q {np.random.randint(1_000_000)}", "answer": "1"}


class RaisesOnBadAction(GuessEnv):
    async def astep(self, action):
        if action == "":
            raise ValueError("empty")
        return await super().astep(action)


class SharesState(GuessEnv):
    shared_log: list = []

    async def areset(self, *, seed=None, options=None):
        observation, info = await super().areset(seed=seed, options=options)
        self.state.messages = SharesState.shared_log
        SharesState.shared_log.clear()
        return observation, info


class ClaimsSnapshots(GuessEnv):
    supports_snapshots = True  # but the secret lives on the instance, not in the episode state

    async def grade_episode(self, state, end):
        return Verdict(reward=float(self._secret["secret"]))


class NeverEnds(TextEnv):
    def __init__(self):
        super().__init__(tasks=[{"question": f"q{i}"} for i in range(10)], max_turns=10_000)

    async def on_final_answer(self, message, state):
        from forge_env import AnswerOutcome

        return AnswerOutcome(reward=0.0, done=False)


class BadTool(GuessEnv):
    async def areset(self, *, seed=None, options=None):
        observation, info = await super().areset(seed=seed, options=options)
        info["tools"].append({"type": "function", "function": {"name": "x"}})
        info["when"] = object()
        return observation, info


@pytest.mark.parametrize(
    "env_class, expected",
    [
        (IgnoresSeed, "same seed gave different opening messages"),
        (RaisesOnBadAction, "bad action (empty text) raised ValueError"),
        (SharesState, "two instances share episode state"),
        (NeverEnds, "never ended the episode"),
        (BadTool, "reset info is not JSON-serialisable"),
        (ClaimsSnapshots, "a snapshot restored in another instance answers a turn differently"),
    ],
)
def test_check_env_reports_violations(env_class, expected):
    with pytest.raises(EnvCheckError) as error:
        check_env(env_class)
    assert expected in str(error.value)


def test_check_env_reports_bad_tool_schema():
    with pytest.raises(EnvCheckError, match="tool 'x' has no description"):
        check_env(BadTool)
