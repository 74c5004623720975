"""``forge-env train`` with ``rollout.source: gateway``: each episode is a harness process (an ``openai`` SDK loop)
against the gateway over the loop's own generator; rewards from the function the config names."""

import sys

import pytest

from agents.train.config import load_grpo_config
from agents.train.loop import train
from agents.train.metrics import read_metrics
from tests.test_gateway_harness import AGENT

pytestmark = pytest.mark.filterwarnings("ignore::forge_env.chat.NonPrefixPreservingTemplateWarning")


def test_a_gateway_source_needs_a_command_and_a_reward():
    with pytest.raises(Exception, match="rollout.gateway.command"):
        load_grpo_config(None, ["rollout.source=gateway"])


async def test_a_short_run_trains_on_harness_episodes(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    config = load_grpo_config(None, [
        "rollout.source=gateway", f"rollout.gateway.command={sys.executable} {script} {{base_url}} {{api_key}} {{seed}}",
        "rollout.gateway.reward=tests.gateway_rewards:reward", "rollout.gateway.timeout_s=120",
        "rollout.group_size=2", "rollout.groups_per_step=2", "rollout.sampling.max_tokens=8",
        "buffer.batch_size=4", "buffer.max_policy_age=1", "advantages.drop_zero_variance=false",
        "trainer.config.lr=1e-4", "trainer.config.micro_batch_size=4", "trainer.config.loss_kwargs.kl_coef=0.0",
        "trainer.config.device=cpu", "generator.service=false", "env.service.backend=inprocess",
        "eval.num_tasks=0", "sft.enabled=false", "loop.steps=1", "loop.mode=sync",
        "logging.tensorboard=false", "logging.progress=false", f"loop.output_dir={tmp_path / 'run'}"])
    result = await train(config)
    assert result.state.step == 1 and result.state.policy_version == 1 and result.state.episodes == 4
    rounds = [r for r in read_metrics(result.output_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert rounds and rounds[0]["rollout/errors"] == 0 and rounds[0]["rollout/turns_mean"] == 2
    assert rounds[0]["rollout/samples_kept"] == 4
