"""``forge-env train`` with ``rollout.source: gateway``: each episode is a harness process (an ``openai`` SDK loop)
against the gateway over the loop's own generator; rewards from the function the config names, or from the env
(SWE-v0 grading the workspace the harness worked in through the gateway)."""

import os
import sys
import textwrap
from pathlib import Path

import pytest

from agents.train.config import load_grpo_config
from agents.train.loop import train
from agents.train.metrics import read_metrics
from tests.sandbox_support import requires_bwrap
from tests.test_gateway_harness import AGENT

ROOT = Path(__file__).resolve().parent.parent

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


SWE_AGENT = textwrap.dedent("""
    import json, os, sys
    import openai
    from agents.gateway.mini_swe import GatewayEnvironment

    base_url, api_key, task_id, tasks, marker = sys.argv[1:6]
    api = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    api.chat.completions.create(model="m", messages=[{"role": "user", "content": "fix it"}], max_tokens=4)
    try:  # the first harness of the group fixes the task with its reference patch, the other leaves it
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        print("done", task_id)
        sys.exit(0)
    patch = next(json.loads(line)["patch"] for line in open(tasks) if json.loads(line)["instance_id"] == task_id)
    shell = GatewayEnvironment(base_url=base_url, api_key=api_key)
    result = shell.execute({"command": "git apply - <<'EOF'\\n" + patch + "EOF"})
    assert result["returncode"] == 0, result
    print("done", task_id)
""")


@requires_bwrap
async def test_rewards_from_the_env_swe_v0_grades_each_harness_episode(tmp_path, monkeypatch):
    from environments.swe.bundled import TASKS

    script = tmp_path / "swe_agent.py"
    script.write_text(SWE_AGENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    command = f"{sys.executable} {script} {{base_url}} {{api_key}} {{task_id}} {TASKS} {tmp_path / 'fixed'}"
    config = load_grpo_config(None, [
        "rollout.source=gateway", f"rollout.gateway.command={command}", "rollout.gateway.reward=env",
        "rollout.gateway.timeout_s=300", "env.id=forge_env/SWE-v0", "env.kwargs.spare_sessions=0",
        "env.kwargs.grading_timeout=120", "env.service.backend=inprocess",
        "rollout.group_size=2", "rollout.groups_per_step=1", "rollout.sampling.max_tokens=4",
        "buffer.batch_size=2", "buffer.max_policy_age=1", "advantages.drop_zero_variance=false",
        "trainer.config.lr=1e-4", "trainer.config.micro_batch_size=2", "trainer.config.loss_kwargs.kl_coef=0.0",
        "trainer.config.device=cpu", "generator.service=false", "eval.num_tasks=0", "sft.enabled=false",
        "loop.steps=1", "loop.mode=sync", "logging.tensorboard=false", "logging.progress=false",
        f"loop.output_dir={tmp_path / 'run'}"])
    result = await train(config)
    assert result.state.step == 1 and result.state.episodes == 2
    rounds = [r for r in read_metrics(result.output_dir / "metrics.jsonl") if r["kind"] == "train"]
    # SWE-v0 graded both workspaces: the patched one resolved (1), the untouched one not (0)
    assert rounds and rounds[0]["rollout/errors"] == 0 and rounds[0]["rollout/reward_mean"] == 0.5
