"""``forge-env gateway CONFIG`` as a process: an OpenAI client plays an episode, the trainer closes it over the
admin route (which exists only with the admin token), the trajectory is answered and written to JSONL."""

import json
import os
import signal
import subprocess
import sys

import openai
import pytest

from agents.trajectory import Trajectory, read_jsonl


@pytest.fixture
def gateway_process(tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text("generator: {config: {max_batch_size: 4}}\nsampling: {max_tokens: 8}\n"
                      f"trajectories: {tmp_path / 'out.jsonl'}\n")
    env = {**os.environ, "FORGE_ENV_GATEWAY_TOKEN": "harness", "FORGE_ENV_GATEWAY_ADMIN_TOKEN": "trainer"}
    process = subprocess.Popen([sys.executable, "-m", "agents.cli", "gateway", str(config), "serve.port=0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert "forge-env gateway:" in line, line + process.stderr.read()
        yield line.split(" on ")[1].split()[0], tmp_path / "out.jsonl"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_gateway_command_serves_episodes_and_hands_trajectories_to_the_trainer(gateway_process):
    base_url, out = gateway_process
    api = openai.OpenAI(base_url=f"{base_url}/e/cli-episode/v1", api_key="harness", max_retries=0)
    messages = [{"role": "user", "content": "hello"}]
    first = api.chat.completions.create(model="m", messages=messages)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    second = api.chat.completions.create(model="m", messages=messages)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base_url}/e/x/v1", api_key="wrong", max_retries=0).models.list()
    import httpx

    harness = httpx.post(f"{base_url}/admin/episodes/cli-episode/finish", json={"reward": 1.0},
                         headers={"Authorization": "Bearer harness"})
    assert harness.status_code == 401  # the harness's token does not open the trainer's routes
    answer = httpx.post(f"{base_url}/admin/episodes/cli-episode/finish", json={"reward": 0.5},
                        headers={"Authorization": "Bearer trainer"}, timeout=30)
    assert answer.status_code == 200, answer.text
    trajectory = Trajectory.from_dict(answer.json())
    trajectory.check()
    assert trajectory.reward == 0.5 and len(trajectory.turns) == 2 and trajectory.segment_starts == [0]
    assert [t.to_json() for t in read_jsonl(str(out))] == [trajectory.to_json()]
    again = httpx.post(f"{base_url}/admin/episodes/cli-episode/finish", json={"reward": 1.0},
                       headers={"Authorization": "Bearer trainer"})
    assert again.status_code == 404 and json.loads(again.text)["error"]["code"] == "episode_not_found"
