"""The rollout loop with the real tiny model: token-exact trajectories, budgets, error isolation."""

import pytest
import torch

import forge_env
from agents.groups import GroupRequest, Progress, rollout_group, stream_groups
from agents.rollout import EpisodeBudget, run_episode
from agents.trajectory import Trajectory, read_jsonl, write_jsonl
from agents.view import render_html
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model

# Stopping on any of these byte tokens keeps a random model's turns short, so episodes have several turns.
STOP_ON_LETTERS = tuple(range(ord("a"), ord("z") + 1))


@pytest.fixture(scope="module")
def kit():
    tokenizer = build_byte_tokenizer()
    model = build_tiny_model(seed=0)
    generator = HFGenerator(model, tokenizer, HFGeneratorConfig(max_batch_size=16))
    yield model, tokenizer, generator, ChatRenderer(tokenizer)
    generator.close()


def math_env():
    # Wrong answers get "try again" feedback, so even a random model plays several turns.
    return forge_env.make("forge_env/Math-v0", max_attempts=3, max_turns=3)


def sampling(seed, **kw):
    return SamplingParams(temperature=1.0, max_tokens=kw.pop("max_tokens", 40), stop_token_ids=STOP_ON_LETTERS,
                          seed=seed, **kw)


def spliced_render(renderer, tokenizer, trajectory):
    """Render the whole conversation in one go with a placeholder per assistant turn, then splice each turn's
    sampled ids in: the token list a correct incremental renderer must have built."""
    messages, turn = [], 0
    for message in trajectory.messages:
        if message["role"] == "assistant":
            message = {"role": "assistant", "content": f"@@{turn}@@"}
            turn += 1
        messages.append(message)
    text = renderer.render_text(messages, trajectory.tools)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = []
    for index in range(turn):
        before, text = text.split(f"@@{index}@@", 1)
        piece = tokenizer.encode(before, add_special_tokens=False)
        if expected and expected[-1] == im_end and piece[:1] == [im_end]:
            piece = piece[1:]  # the sampled turn already ended with the end-of-turn token
        expected += piece + trajectory.sampled_ids(index)
    return expected


def recompute_logprobs(model, token_ids):
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    return [0.0] + [float(logprobs[i - 1, token_ids[i]]) for i in range(1, len(token_ids))]


async def test_trajectory_is_token_exact(kit):
    model, tokenizer, generator, renderer = kit
    trajectory = await run_episode(math_env(), generator, renderer, sampling=sampling(1), seed=4, env_id="math")
    assert trajectory.ok, trajectory.error
    assert len(trajectory.turns) >= 2, "multi-turn retries expected"
    trajectory.check()
    # The sampled part is exactly the per-turn sampled tokens, in order.
    sampled = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    assert sampled == [t for i in range(len(trajectory.turns)) for t in trajectory.sampled_ids(i)]
    # The context tokens are exactly what the chat template renders around the sampled turns.
    assert trajectory.token_ids == spliced_render(renderer, tokenizer, trajectory)
    # Sampler logprobs (temperature 1, no filters) align with a forward pass over the whole episode.
    recomputed = recompute_logprobs(model, trajectory.token_ids)
    for i, mask in enumerate(trajectory.loss_mask):
        if mask:
            assert trajectory.logprobs[i] == pytest.approx(recomputed[i], abs=2e-3)
        else:
            assert trajectory.logprobs[i] == 0.0
    # The second turn reused the session's KV cache up to the end of the first turn.
    assert trajectory.turns[1].num_cached_tokens >= trajectory.turns[0].gen_end - 1


async def test_sample_conversion_and_json_round_trip(kit, tmp_path):
    _, tokenizer, generator, renderer = kit
    trajectory = await run_episode(math_env(), generator, renderer, sampling=sampling(2), seed=1, group_id="g")
    sample = trajectory.to_sample(advantage=0.5)
    assert sample.token_ids == trajectory.token_ids and sample.loss_mask == trajectory.loss_mask
    assert sample.old_logprobs == trajectory.logprobs and sample.advantage == 0.5 and sample.group_id == "g"
    path = tmp_path / "t.jsonl"
    write_jsonl([trajectory], str(path))
    assert read_jsonl(str(path)) == [trajectory]
    page = render_html([trajectory], tokenizer.decode)
    assert page.count('class="gen"') == len(trajectory.turns)


@pytest.mark.parametrize(
    "budget, sampling_kw, reason",
    [
        (EpisodeBudget(max_total_tokens=260), {"max_tokens": 200}, "max_tokens"),
        (EpisodeBudget(), {"max_tokens": 3, "stop_token_ids": ()}, "generation_length"),
        (EpisodeBudget(max_turns=1), {}, "max_turns"),
        (EpisodeBudget(max_prompt_tokens=10), {}, "prompt_too_long"),
    ],
)
async def test_truncations_record_their_reason(kit, budget, sampling_kw, reason):
    _, _, generator, renderer = kit
    params = sampling(3, **{k: v for k, v in sampling_kw.items() if k != "stop_token_ids"})
    if "stop_token_ids" in sampling_kw:
        params = SamplingParams(temperature=1.0, max_tokens=sampling_kw["max_tokens"], seed=3)
    trajectory = await run_episode(math_env(), generator, renderer, sampling=params, seed=0, budget=budget)
    assert trajectory.ok and trajectory.truncated and trajectory.truncation_reason == reason
    trajectory.check()
    if budget.max_total_tokens:
        assert len(trajectory.token_ids) <= budget.max_total_tokens


class SlowEnv:
    """Wraps an env and stalls on step: the loop's env timeout must cut it."""

    def __init__(self, env):
        self.env = env

    async def areset(self, **kw):
        return await self.env.areset(**kw)

    async def astep(self, action):
        import asyncio

        await asyncio.sleep(5)


async def test_env_timeout_is_a_truncation(kit):
    _, _, generator, renderer = kit
    trajectory = await run_episode(SlowEnv(math_env()), generator, renderer, sampling=sampling(5), seed=0,
                                   budget=EpisodeBudget(step_timeout_s=0.2))
    assert trajectory.truncated and trajectory.truncation_reason == "env_timeout"


class TextSummaryEnv(SlowEnv):
    """Ends on the first step with a summary holding text as well as numbers (as SWE-v0's does)."""

    async def astep(self, action):
        summary = {"return": 1.0, "resolved": True, "fail_to_pass": "2/3", "verdict_by": "pytest"}
        return [], 1.0, True, False, {"episode_summary": summary}


async def test_an_episode_summary_with_text_keeps_its_numbers(kit):
    _, _, generator, renderer = kit
    trajectory = await run_episode(TextSummaryEnv(math_env()), generator, renderer, sampling=sampling(5), seed=0)
    assert trajectory.ok and trajectory.terminated, trajectory.error
    assert {k: v for k, v in trajectory.metrics.items() if k.startswith("episode_")} == {
        "episode_return": 1.0, "episode_resolved": 1.0}


class ResumedEnv(SlowEnv):
    """Says its step was resumed on another replica (what a durable EnvService session reports)."""

    async def astep(self, action):
        return [], 0.0, True, False, {"resumed": {"from_turn": 0, "reason": "replica lost", "attempts": 1}}


async def test_a_resumed_step_is_recorded_in_the_trajectory(kit):
    _, _, generator, renderer = kit
    trajectory = await run_episode(ResumedEnv(math_env()), generator, renderer, sampling=sampling(5), seed=0)
    assert trajectory.ok and trajectory.metrics["env_resumes"] == 1.0
    assert trajectory.metrics["env_resumed_from_turn"] == 0.0


async def test_one_failing_episode_does_not_affect_its_group(kit):
    _, _, generator, renderer = kit
    built = []

    def factory():
        built.append(1)
        if len(built) == 2:
            raise RuntimeError("env host is down")
        env = math_env()
        if len(built) == 3:
            async def broken_step(action):
                raise ValueError("env bug")
            env.astep = broken_step
        return env

    group = await rollout_group(factory, generator, renderer, GroupRequest(seed=7, n=4),
                                sampling=sampling(10))
    statuses = [t.status for t in group]
    assert statuses.count("error") == 2
    assert "env host is down" in group[1].error and "env bug" in group[2].error
    healthy = [t for t in group if t.ok]
    assert len(healthy) == 2 and all(t.turns for t in healthy)
    assert len({t.group_id for t in group}) == 1
    assert all(t.task == healthy[0].task for t in healthy)


async def test_group_seeds_reproduce_and_stream_yields_every_group(kit):
    _, _, generator, renderer = kit
    a = await rollout_group(math_env, generator, renderer, GroupRequest(seed=3, n=3), sampling=sampling(100))
    b = await rollout_group(math_env, generator, renderer, GroupRequest(seed=3, n=3), sampling=sampling(100))
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert a[0].token_ids != a[1].token_ids  # different sampling seeds within the group
    progress = Progress(every_s=0)
    groups = [g async for g in stream_groups([GroupRequest(seed=s, n=2) for s in range(5)], math_env, generator,
                                             renderer, sampling=sampling(0), max_episodes_in_flight=4,
                                             progress=progress)]
    assert sorted(len(g) for g in groups) == [2] * 5 and progress.episodes == 10
    assert isinstance(groups[0][0], Trajectory)


async def test_env_service_rollouts_equal_local_rollouts(kit):
    """The same seeds and sampling seeds give the same trajectories against an EnvService (real processes)."""
    from forge_env.services import EnvService

    _, _, generator, renderer = kit
    env_kwargs = {"max_attempts": 3, "max_turns": 3}
    local = await rollout_group(lambda: forge_env.make("forge_env/Math-v0", **env_kwargs), generator, renderer,
                                GroupRequest(seed=11, n=3), sampling=sampling(40))
    async with await EnvService.launch("forge_env/Math-v0", num_replicas=2, env_kwargs=env_kwargs) as envs:
        remote = await rollout_group(envs.env, generator, renderer, GroupRequest(seed=11, n=3), sampling=sampling(40))
    assert all(t.ok for t in remote), [t.error for t in remote]
    for a, b in zip(local, remote, strict=True):
        assert (a.token_ids, a.loss_mask, a.reward, a.messages) == (b.token_ids, b.loss_mask, b.reward, b.messages)
        # Batches of different shapes round differently; the sampled tokens above are identical.
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


async def test_tiny_model_rollouts_against_tool_use_env_service(kit):
    """Issue 10: the tiny model plays ToolUse-v0 served by an EnvService on Monarch processes."""
    from forge_env.services import EnvService

    _, _, generator, renderer = kit
    async with await EnvService.launch("forge_env/ToolUse-v0", num_replicas=1, env_kwargs={"hops": 1}) as envs:
        group = await rollout_group(envs.env, generator, renderer, GroupRequest(seed=2, n=2),
                                    sampling=sampling(8, max_tokens=24), budget=EpisodeBudget(max_turns=3))
    for trajectory in group:
        assert trajectory.ok, trajectory.error
        trajectory.check()
        assert trajectory.turns and trajectory.tools and trajectory.tools[0]["function"]["name"] == "search"
        assert trajectory.messages[1]["role"] == "user"
