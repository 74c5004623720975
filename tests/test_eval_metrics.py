"""Issue 22 without a server: pass@k, the summary's error accounting, list-of-parts actions, the buffer's refusal."""

import itertools
import json

import pytest

import forge_env
from agents.eval.metrics import format_compare, pass_at_k, reported_ks, summarize
from agents.eval.runner import load_finished, plan_episodes
from agents.trajectory import Trajectory, Turn
from forge_env.generation.endpoints.chat import _incoming
from forge_env.rl import MessageLevelTrajectoryError, ReplayBuffer, TrainSample


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 1), (5, 2, 2), (5, 2, 3), (6, 0, 2), (4, 4, 4), (7, 3, 5)])
def test_pass_at_k_is_the_chance_that_k_of_n_samples_include_a_pass(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError, match="at least"):
        pass_at_k(n, c, n + 1)


def episode(task, sample, reward, status="ok", error_kind=None, turns=1):
    return Trajectory(episode_id=f"{task}-s{sample}", group_id=task, reward=reward, status=status,
                      error_kind=error_kind, turns=[Turn(0, 0, 0, 0, "stop") for _ in range(turns)],
                      metrics={"correct": reward}, messages=[{"role": "tool", "content": "x"}])


def test_endpoint_errors_are_counted_apart_and_never_scored():
    trajectories = [episode("t0", 0, 1.0), episode("t0", 1, 0.0), episode("t1", 0, 0.0),
                    episode("t1", 1, 0.0, status="error", error_kind="endpoint")]
    summary = summarize(trajectories, samples=2)
    assert summary["ok"] == 3 and summary["errors"] == summary["endpoint_errors"] == 1
    assert summary["mean_reward"] == pytest.approx(1 / 3)  # 3 scored episodes, not 4
    assert summary["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert summary["pass@2"] == pytest.approx(1.0)  # only t0 still has 2 samples
    assert summary["metrics"]["correct"] == pytest.approx(1 / 3) and summary["mean_tool_calls"] == 1
    assert reported_ks(8) == [1, 2, 4, 8] and reported_ks(3) == [1, 2, 3]
    table = format_compare(summary, summarize(trajectories[:2], samples=2), "a", "b")
    assert "pass@1" in table and "delta" in table


def test_plan_is_the_same_for_every_model_and_resume_drops_endpoint_errors(tmp_path):
    plan = plan_episodes(seed=5, n_tasks=2, samples=2)
    assert [(p.episode_id, p.env_seed) for p in plan] == [("task5-s0", 5), ("task5-s1", 5), ("task6-s0", 6),
                                                          ("task6-s1", 6)]
    assert plan == plan_episodes(seed=5, n_tasks=2, samples=2)
    assert len({p.sampling_seed for p in plan}) == 4
    path = tmp_path / "episodes.jsonl"
    rows = [episode("task5", 0, 1.0), episode("task5", 1, 0.0, status="error", error_kind="endpoint"),
            episode("task99", 0, 1.0)]
    path.write_text("".join(t.to_json() + "\n" for t in rows))
    kept = load_finished(path, plan)
    assert [t.episode_id for t in kept] == ["task5-s0"]
    assert [json.loads(line)["episode_id"] for line in path.read_text().splitlines()] == ["task5-s0"]


async def test_env_accepts_list_of_parts_content_and_sdk_tool_calls():
    from openai.types.chat import ChatCompletionMessage

    env = forge_env.make("forge_env/Arithmetic-v0")
    observation, _ = await env.areset(seed=3)
    question = observation[-1]["content"].removeprefix("What is ").removesuffix("?")
    # A tool call exactly as the openai SDK returns it, converted without parsing any text.
    sdk_message = ChatCompletionMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator",
                                                          "arguments": json.dumps({"expression": question})}}]})
    message = _incoming(sdk_message)
    assert message["tool_calls"][0]["function"]["name"] == "calculator"
    observation, *_ = await env.astep(message)
    assert observation[0]["role"] == "tool" and not observation[0]["content"].startswith("Error")
    parts = [{"type": "text", "text": "The answer is "}, {"type": "text", "text": observation[0]["content"]}]
    _, reward, terminated, _, _ = await env.astep({"role": "assistant", "content": parts})
    assert terminated and reward == 1.0
    env2 = forge_env.make("forge_env/Arithmetic-v0")
    await env2.areset(seed=3)
    observation, reward, terminated, *_ = await env2.astep(
        {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})
    assert not terminated and "only text content parts" in observation[0]["content"]


def test_buffer_refuses_message_level_samples():
    trajectory = Trajectory(episode_id="e", level="message")
    with pytest.raises(MessageLevelTrajectoryError, match="cannot be trained on"):
        trajectory.to_sample()
    sample = TrainSample(token_ids=[1, 2], loss_mask=[0, 1], old_logprobs=[0.0, -1.0], metadata={"level": "message"})
    with pytest.raises(MessageLevelTrajectoryError, match="refuses message-level"):
        ReplayBuffer().add(sample)
    assert ReplayBuffer().add(TrainSample(token_ids=[1, 2], loss_mask=[0, 1], old_logprobs=[0.0, -1.0])) == 1
