"""Failures of the machine are not rewards: a broken sandbox, a stalled tool or a dead replica ends the
episode as ``infra_error``, and training plays it again or drops its group (and counts it) instead of learning
a 0 from it (``rollout.lost_episodes``; tests/test_lost_episodes.py).

A grading run that fails in the sandbox is retried first, and only a sandbox that then fails a program
that does nothing is the machine's failure (environments/coding/grading_runs.py; a failure that follows
the graded code grades 0: tests/test_coding_worker_loss.py).
"""

import asyncio
import collections
import contextvars
import dataclasses

import pytest

from agents.train.components import build_components
from agents.train.config import load_grpo_config
from agents.train.loop import GRPOLoop
from agents.train.metrics import MetricsLogger
from environments.coding import CodingEnv
from forge_env import InfraError, TextEnv, Tool
from forge_env.sandbox import ExecResult, shared_sandbox

STOP_ON_LETTERS = tuple(range(ord("a"), ord("z") + 1))
TASK = {"prompt": "def double(x):\n    \"\"\"Twice x.\"\"\"\n", "entry_point": "double",
        "tests": ["assert double(2) == 4", "assert double(-1) == -2"], "solution": "def double(x):\n    return 2 * x\n"}


#: Set while the machine is down: every sandbox run then reports that the sandbox itself failed.
OUTAGE: contextvars.ContextVar[bool] = contextvars.ContextVar("outage", default=False)


class FaultySandbox:
    """The real sandbox, except during an outage (:data:`OUTAGE`), or for the runs numbered in ``fail``:
    those report that the sandbox itself failed."""

    def __init__(self, real, fail: tuple[int, ...] = ()):
        self.real = real
        self.limits = real.limits
        self.fail = fail
        self.runs = 0
        self.injected = 0

    async def run(self, code, **kwargs):
        self.runs += 1
        if OUTAGE.get() or self.runs in self.fail:
            self.injected += 1
            return ExecResult(stderr="worker lost (injected)", killed_reason="sandbox_error")
        return await self.real.run(code, **kwargs)

    def session(self):
        return self.real.session()


class ExpertCodingEnv(CodingEnv):
    """Coding-v0 grading the task's reference solution whatever the policy wrote, so every episode that
    reaches grading earns 1 unless the sandbox fails: a tiny random model never writes working code.
    Every other grading (counted in ``gradings``, shared) happens during an outage of the sandbox."""

    def __init__(self, *args, gradings: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.gradings = gradings

    async def astep(self, action):
        self.gradings.append(len(self.gradings))
        token = OUTAGE.set(len(self.gradings) % 2 == 0)
        try:
            return await super().astep(self.expert_action())
        finally:
            OUTAGE.reset(token)


async def test_a_sandbox_that_fails_whatever_it_runs_raises_instead_of_scoring_zero():
    sandbox = FaultySandbox(shared_sandbox(), fail=(2,))
    env = CodingEnv(tasks=[TASK], max_attempts=1, sandbox=sandbox)
    await env.areset(options={"task": TASK})
    _, reward, terminated, _, _ = await env.astep(env.expert_action())
    assert reward == 1.0 and terminated  # run 1: the real sandbox
    await env.areset(options={"task": TASK})
    _, reward, terminated, _, info = await env.astep(env.expert_action())
    assert reward == 1.0 and info["metrics"]["grading_retries"] == 1.0  # run 2 failed, run 3 graded it
    await env.areset(options={"task": TASK})
    token = OUTAGE.set(True)
    try:
        with pytest.raises(InfraError, match="fails even a program that does nothing"):
            await env.astep(env.expert_action())  # the run, its retry and a harmless probe all fail
    finally:
        OUTAGE.reset(token)
    assert env.state.done and env.state.released
    assert sandbox.injected == 1 + 3


async def test_a_tool_that_outlives_its_own_deadline_is_an_infra_error():
    async def stalled() -> str:
        await asyncio.sleep(30)
        return "never"

    held_up = Tool("held_up", "A tool whose work the machine stalls.", {"type": "object", "properties": {}},
                   stalled, timeout=0.1, timeout_is_infra=True)
    env = TextEnv(tasks=[{"question": "q"}], tools=[held_up])
    await env.areset(seed=0)
    with pytest.raises(InfraError, match="held_up"):
        await env.astep('<tool_call>{"name": "held_up", "arguments": {}}</tool_call>')


async def test_coding_training_drops_and_counts_episodes_the_sandbox_failed(tmp_path):
    config = load_grpo_config(None, [
        "env.id=forge_env/Coding-v0", "env.kwargs={max_attempts: 1}", "env.service.backend=inprocess",
        "rollout.group_size=2", "rollout.groups_per_step=3", "rollout.max_turns=1", "rollout.max_total_tokens=6000",
        "rollout.sampling.max_tokens=64", "buffer.batch_size=2", "advantages.drop_zero_variance=false",
        "trainer.config.device=cpu", "generator.service=false", "eval.num_tasks=0", "sft.enabled=false",
        "logging.tensorboard=false", "logging.progress=false", f"loop.output_dir={tmp_path / 'run'}"])
    sandbox = FaultySandbox(shared_sandbox())
    gradings: list[int] = []
    components = await build_components(config)
    components.env_factory = lambda: ExpertCodingEnv(tasks=[TASK], max_attempts=1, sandbox=sandbox, gradings=gradings)
    try:
        loop = GRPOLoop(config, components, MetricsLogger(tmp_path / "logs", tensorboard=False))
        round_sampling = loop.round_sampling
        # Stop each turn at the first letter: a random model's turn then ends by itself and reaches grading.
        loop.round_sampling = lambda index: dataclasses.replace(round_sampling(index), stop_token_ids=STOP_ON_LETTERS)
        metrics = await loop.collect_round()
    finally:
        await components.close()
    outages = len(gradings) // 2
    assert outages >= 1 and sandbox.injected == 3 * outages  # each: the run, its retry, the probe
    assert metrics["rollout/infra_failures"] == outages
    assert metrics["rollout/errors"] == outages  # nothing else went wrong
    samples = [entry.sample for entry in components.buffer._entries.values()]
    # Each lost episode was played again (rollout.lost_episodes=refill, at most 2 per group) or, refills
    # spent, its group was dropped whole: no group trains over its survivors (issue 47).
    dropped = metrics["rollout/groups_dropped_lost"]
    assert metrics["rollout/refills"] >= 1 and metrics["rollout/episodes"] == 6 + metrics["rollout/refills"]
    assert len(samples) == 2 * (3 - dropped)
    per_group = collections.Counter(sample.group_id for sample in samples)
    assert all(count == 2 for count in per_group.values())
    graded = [sample.reward for sample in samples if sample.metadata["truncation_reason"] is None]
    assert graded and all(reward == 1.0 for reward in graded)  # no sandbox failure became a 0
