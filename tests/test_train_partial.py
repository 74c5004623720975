"""Partial rollouts (``loop.partial_rollouts``): a weight update that lands in the middle of an episode,
per-token policy versions, per-token staleness in the buffer, and the streaming loop on real parts
(the tiny model, ``HFGenerator``, the trainer, the weight store)."""

from __future__ import annotations

import copy

import pytest
import torch

from agents.rollout import EpisodeBudget, run_episode
from agents.train.config import ConfigError, load_grpo_config
from agents.train.ingest import version_metrics
from agents.train.loop import train
from agents.train.metrics import read_metrics
from benchmarks.async_vs_sync import LONG_TAIL_ID, LongTailEnv, register_long_tail
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import TINY_MODEL_ID, load_model_and_tokenizer
from forge_env.rl.buffer import ReplayBuffer
from forge_env.rl.types import InvalidSampleError, TrainSample

#: Half the byte ids end a turn: turns of a couple of tokens from the untrained model, never cut by length.
STOPS = tuple(range(0, 256, 2))


def three_turns(versions: list[int], spans=((3, 5), (7, 9), (11, 13))) -> TrainSample:
    mask = [0] * 14
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    return TrainSample(token_ids=list(range(1, 15)), loss_mask=mask,
                       old_logprobs=[-0.5 if m else 0.0 for m in mask], policy_versions=versions,
                       turn_spans=[list(s) for s in spans], group_id="g", episode_id="e")


def test_each_token_keeps_the_version_of_the_turn_that_sampled_it():
    sample = three_turns([0, 1, 1])
    versions = sample.token_policy_versions()
    assert versions[3:5] == [0, 0] and versions[7:9] == [1, 1] and versions[11:13] == [1, 1]
    assert [v for v, m in zip(versions, sample.loss_mask, strict=True) if not m] == [None] * 8
    assert TrainSample.from_dict(sample.to_dict()).token_policy_versions() == versions
    with pytest.raises(InvalidSampleError, match="one span per turn"):
        three_turns([0, 1])
    with pytest.raises(InvalidSampleError, match="out of order"):
        three_turns([0, 1, 2], spans=((7, 9), (3, 5), (11, 13)))


def test_token_staleness_masks_the_old_turns_and_drops_a_sample_with_none_left():
    buffer = ReplayBuffer(batch_size=1, max_policy_age=1, staleness="token", max_resample_count=None)
    buffer.add([three_turns([0, 1, 2]), three_turns([0, 0, 0])])
    batch = buffer.sample(3)  # versions 2 and 3 are fresh
    assert batch is not None and len(buffer) == 1
    (kept,) = batch
    assert kept.loss_mask[3:5] == [0, 0] and kept.loss_mask[7:9] == [0, 0] and kept.loss_mask[11:13] == [1, 1]
    assert kept.old_logprobs[3:9] == [0.0] * 6 and kept.old_logprobs[11:13] == [-0.5, -0.5]
    assert kept.policy_versions == [2] and kept.turn_spans == [[11, 13]]
    assert kept.token_policy_versions()[11:13] == [2, 2] and kept.metadata["stale_tokens_masked"] == 4
    metrics = buffer.metrics(3)
    assert metrics["buffer/stale_tokens_masked"] == 4 and metrics["buffer/stale_turns_masked"] == 2
    assert metrics["buffer/evicted_policy_age"] == 1  # the sample sampled only at version 0
    # Per episode (the default) the same sample leaves whole: its oldest turn is too old.
    episode = ReplayBuffer(batch_size=1, max_policy_age=1)
    episode.add(three_turns([0, 1, 2]))
    assert episode.sample(3) is None and episode.metrics(3)["buffer/evicted_policy_age"] == 1


def _perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def _teacher_forced(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """``out[i]``: the model's logprob of ``token_ids[i]`` given the tokens before it (out[0] = 0)."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(token_ids[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), logprobs])


class UpdateAfterFirstTurn(LongTailEnv):
    """Three-turn episodes; the reply to the first turn waits until the generator loaded new weights."""

    def __init__(self, update, **kwargs):
        super().__init__(short_turns=3, factor=1, **kwargs)
        self.update = update

    async def on_final_answer(self, message, state):
        if "turns" not in state.data:
            await self.update()
        return await super().on_final_answer(message, state)


@pytest.mark.parametrize("keep_sessions", [False, True])
async def test_an_update_mid_episode_moves_the_later_turns_to_the_new_weights(keep_sessions):
    """Turn 0 on version 0, turns 1-2 on version 1: each turn's logprobs are exactly its version's (the
    generator drops the session's KV cache at the update, so turn 1 re-prefills). Keeping the cache (what
    ``check_partial_rollouts`` refuses) leaves turn 1 attending to old-weight KV: not the new policy's."""
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL_ID, seed=0)
    old = copy.deepcopy(model).eval()
    new_state = _perturbed(model, seed=1)
    new = copy.deepcopy(model).eval()
    new.load_state_dict(new_state)
    generator = HFGenerator(model, tokenizer, HFGeneratorConfig(keep_sessions_on_update=keep_sessions))
    try:
        env = UpdateAfterFirstTurn(lambda: generator.load_state_dict(new_state, version=1))
        trajectory = await run_episode(env, generator, ChatRenderer(tokenizer),
                                       sampling=SamplingParams(max_tokens=12, stop_token_ids=STOPS, seed=3),
                                       seed=0, budget=EpisodeBudget(max_turns=5))
    finally:
        generator.close()
    assert trajectory.ok and len(trajectory.turns) == 3, trajectory.error
    assert [t.policy_version for t in trajectory.turns] == [0, 1, 1]
    sample = trajectory.to_sample()
    versions = sample.token_policy_versions()
    for turn in trajectory.turns:
        assert versions[turn.gen_start:turn.gen_end] == [turn.policy_version] * (turn.gen_end - turn.gen_start)
    sampled = torch.tensor(trajectory.logprobs)
    by_version = {0: _teacher_forced(old, trajectory.token_ids), 1: _teacher_forced(new, trajectory.token_ids)}
    first, later = trajectory.turns[0], trajectory.turns[1]
    span0, span1 = slice(first.gen_start, first.gen_end), slice(later.gen_start, later.gen_end)
    torch.testing.assert_close(sampled[span0], by_version[0][span0], atol=1e-4, rtol=0)
    # The two versions disagree on these tokens, so matching one of them says which sampled them.
    assert (by_version[0][span1] - by_version[1][span1]).abs().max() > 1e-2
    metrics = version_metrics([trajectory])
    assert metrics["rollout/partial/episodes_spanning_updates_frac"] == 1.0
    assert metrics["rollout/partial/turns_after_update"] == 1.0
    assert metrics["rollout/partial/reprefilled_tokens"] == later.gen_start - later.num_cached_tokens
    if not keep_sessions:
        assert later.num_cached_tokens == 0 and trajectory.turns[2].num_cached_tokens > 0
        for turn in trajectory.turns[1:]:
            span = slice(turn.gen_start, turn.gen_end)
            torch.testing.assert_close(sampled[span], by_version[1][span], atol=1e-4, rtol=0)
    else:
        assert later.num_cached_tokens > 0
        assert (sampled[span1] - by_version[1][span1]).abs().max() > 1e-3


def test_partial_rollouts_config_is_checked():
    ok = ["loop.mode=async", "loop.partial_rollouts=true"]
    load_grpo_config(None, ok)
    cases = {
        ("loop.partial_rollouts=true",): "needs loop.mode=async",
        (*ok, "rollout.dynamic_sampling.enabled=true", "advantages.drop_zero_variance=true"): "dynamic sampling",
        (*ok, "generator.config={keep_sessions_on_update: true}"): "keep_sessions_on_update",
        ("loop.overprovision=2",): "set loop.partial_rollouts=true",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_grpo_config(None, list(overrides))


@pytest.mark.parametrize("overprovision", [0, 1])
async def test_a_partial_rollouts_run_bounds_every_trained_token_by_its_own_version(tmp_path, monkeypatch,
                                                                                   overprovision):
    """Three steps streaming multi-turn episodes: every token a step trains on was sampled at most
    ``max_policy_age`` versions before it, whatever the episode's other turns; the generator ends on the
    last pushed version and the round metrics carry the partial-rollout counters (with over-provisioning
    too: aborted groups are dropped, never half-ingested)."""
    from forge_env.rl.trainer import TorchTrainer

    register_long_tail()
    seen: list[list[TrainSample]] = []
    original = TorchTrainer.train_step

    def recording(self, batch):
        seen.append(list(batch))
        return original(self, batch)

    monkeypatch.setattr(TorchTrainer, "train_step", recording)
    config = load_grpo_config(None, [
        "loop.mode=async", "loop.partial_rollouts=true", f"loop.overprovision={overprovision}", "loop.steps=3", f"loop.output_dir={tmp_path / 'run'}",
        f"env.id={LONG_TAIL_ID}", "env.service.backend=local", "env.kwargs={short_turns: 2, factor: 3}",
        "rollout.group_size=2", "rollout.groups_per_step=2", "rollout.max_turns=8", "rollout.max_total_tokens=600",
        "rollout.sampling.max_tokens=12", f"rollout.sampling.stop_token_ids={list(STOPS)}",
        "rollout.max_episodes_in_flight=6", "buffer.batch_size=4", "buffer.max_policy_age=1",
        "advantages.drop_zero_variance=false", "trainer.config.lr=1e-3", "trainer.config.micro_batch_size=4",
        "trainer.config.loss_kwargs.kl_coef=0.0", "trainer.config.device=cpu", "generator.service=false",
        "eval.num_tasks=0", "logging.tensorboard=false", "logging.progress=false"])
    result = await train(config)
    assert result.state.step == 3 and result.state.policy_version == 3
    assert len(seen) == 3
    for step, batch in enumerate(seen):  # step k trains at version k (pushed after step k-1)
        for sample in batch:
            versions = [v for v in sample.token_policy_versions() if v is not None]
            assert versions and min(versions) >= step - 1, (step, sample.policy_versions)
    records = [r for r in read_metrics(result.output_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert len(records) == 3
    for key in ("rollout/partial/episodes_spanning_updates_frac", "rollout/partial/reprefilled_tokens",
                "rollout/partial/groups_aborted", "buffer/stale_tokens_masked"):
        assert key in records[-1], key
    assert result.state.episodes >= 12 and result.state.rounds >= 3
