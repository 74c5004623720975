"""Harness processes against the gateway (``run_harnesses``): an ``openai`` SDK tool loop per episode, rewards
from a function, a harness that fails and one that hangs past its timeout."""

import sys
import textwrap

import pytest

from agents.gateway import AgentGateway, GatewayConfig
from agents.gateway.app import GatewayServer
from agents.gateway.harness import HarnessSpec, harness_argv, run_harness, run_harnesses
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::forge_env.chat.NonPrefixPreservingTemplateWarning")

AGENT = textwrap.dedent("""
    import sys
    import openai

    api = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
    messages = [{"role": "user", "content": "task " + sys.argv[3]}]
    for turn in range(2):
        reply = api.chat.completions.create(model="m", messages=messages, max_tokens=8).choices[0].message
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    print("done", sys.argv[3])
""")


@pytest.fixture(scope="module")
def kit():
    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=8))
    gateway = AgentGateway(generator, ChatRenderer(tokenizer),
                           GatewayConfig(default_sampling=SamplingParams(temperature=1.0, max_tokens=8)))
    yield gateway
    generator.close()


def test_the_command_template_is_filled_per_argument_never_by_a_shell():
    spec = HarnessSpec(command="agent --url {base_url} --name '{episode_id}; rm -rf /' --key={api_key}")
    assert harness_argv(spec, "http://h/e/x/v1", "x") == ["agent", "--url", "http://h/e/x/v1", "--name",
                                                          "x; rm -rf /", "--key=forge-env"]
    with pytest.raises(ValueError, match="base_url"):
        harness_argv(HarnessSpec(command="agent {secret}"), "u", "x")


async def test_harness_processes_play_episodes_and_get_rewards(kit, tmp_path):
    gateway = kit
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    spec = HarnessSpec(command=[sys.executable, str(script), "{base_url}", "{api_key}", "{episode_id}"], timeout_s=120)
    seen = []

    def reward(trajectory, result):
        seen.append(result.output)
        return 1.0 if "done" in result.output else 0.0

    async with GatewayServer(gateway) as server:
        trajectories = await run_harnesses(gateway, server, spec, 4, reward=reward, concurrency=4, task_id="t1")
        failing = await run_harness(gateway, server, HarnessSpec(command=[sys.executable, "-c", "exit(3)"]))
        hanging = await run_harness(gateway, server, HarnessSpec(
            command=[sys.executable, "-c", "import time; time.sleep(600)"], timeout_s=1), reward=lambda t, r: 0.25)
    for trajectory in trajectories:
        trajectory.check()
        assert trajectory.ok and trajectory.reward == 1.0 and len(trajectory.turns) == 2
        assert trajectory.task == {"task_id": "t1"} and trajectory.segment_starts == [0]
    assert len({t.episode_id for t in trajectories}) == 4 and len(seen) == 4
    assert failing.status == "error" and "exited with 3" in failing.error
    assert hanging.truncated and hanging.truncation_reason == "deadline"
    assert hanging.status == "error" and "never called the model" in hanging.error  # no call: nothing to train
    assert gateway.open_episodes == []
