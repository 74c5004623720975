"""The GRPO loops end to end with real parts: the tiny model, the trainer, the weight store, environment
replicas on Monarch, a generator service; plus checkpoint/resume and the reports a run leaves behind."""

import json

import pytest

from agents.train.checkpoint import latest_checkpoint, load_checkpoint
from agents.train.components import build_components
from agents.train.config import load_grpo_config
from agents.train.loop import GRPOLoop, train
from agents.train.metrics import MetricsLogger, read_metrics

pytestmark = pytest.mark.slow

SMALL = [
    "env.kwargs={num_operands: 2, digits: 1, operators: '+', max_turns: 3}",
    "rollout.group_size=2", "rollout.groups_per_step=2", "rollout.max_turns=3", "rollout.max_total_tokens=400",
    "rollout.sampling.max_tokens=24", "buffer.batch_size=4", "buffer.max_policy_age=1",
    "advantages.drop_zero_variance=false", "trainer.config.lr=1e-4", "trainer.config.micro_batch_size=4",
    "trainer.config.loss_kwargs.kl_coef=0.0",
    "trainer.config.device=cpu", "eval.num_tasks=3", "eval.max_tokens=24", "eval.view_episodes=2",
    "logging.tensorboard=false", "logging.progress=false",
]


def small_config(tmp_path, *extra):
    return load_grpo_config(None, [*SMALL, f"loop.output_dir={tmp_path / 'run'}", *extra])


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_short_run_trains_syncs_weights_and_reports(tmp_path, mode):
    """A few steps on Monarch env replicas; the generator service loads every pushed version."""
    # The async run also keeps a reference model: GRPO's KL term is on there.
    kl = ["trainer.config.loss_kwargs.kl_coef=0.04"] if mode == "async" else []
    config = small_config(tmp_path, f"loop.mode={mode}", "loop.steps=2", "generator.service=true", *kl,
                          "sft.enabled=true", "sft.steps=2", "sft.batch_size=2", "sft.num_demonstrations=4",
                          "sft.direct_answer_fraction=0.5")
    result = await train(config)
    assert result.state.step == 2 and result.state.policy_version == 2
    assert result.state.episodes >= 8 and result.state.next_task == 2 * result.state.rounds
    records = read_metrics(result.output_dir / "metrics.jsonl")
    kinds = [r["kind"] for r in records]
    assert kinds.count("train") == 2 and kinds.count("eval") == 2 and kinds[0] == "sft"
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["policy_version"] for r in train_records] == [1.0, 2.0]
    assert all(r["num_samples"] == 4 for r in train_records)
    assert result.eval_before is not None and result.eval_before.num_episodes == 3
    for name in ("plot", "view", "summary", "checkpoint"):
        assert result.files[name]
    assert (result.output_dir / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "held-out episodes" in (result.output_dir / "eval_episodes.html").read_text()
    summary = json.loads((result.output_dir / "summary.json").read_text())
    assert summary["mode"] == mode and summary["state"]["step"] == 2


async def test_checkpoint_resume_continues_from_the_same_step_and_buffer(tmp_path):
    """Stop after 1 step; a resumed run starts at step 1 with the saved buffer, data position and weights."""
    config = small_config(tmp_path, "loop.steps=1", "loop.checkpoint_every=1", "generator.service=false",
                          "env.service.backend=local", "buffer.max_policy_age=3", "rollout.groups_per_step=4",
                          "eval.num_tasks=0")
    first = await train(config)
    checkpoint = latest_checkpoint(config.loop.output_dir)
    assert checkpoint is not None and checkpoint.name == "step_000001"
    saved_buffer = json.loads((checkpoint / "buffer.json").read_text())
    assert len(saved_buffer["entries"]) == 4, "a round gives 8 samples, a step takes 4: 4 are left"

    resumed_config = small_config(tmp_path, "loop.steps=2", "loop.resume=true", "generator.service=false",
                                  "env.service.backend=local", "buffer.max_policy_age=3",
                                  "rollout.groups_per_step=4", "eval.num_tasks=0")
    components = await build_components(resumed_config)
    logger = MetricsLogger(tmp_path / "resumed", tensorboard=False)
    try:
        loop = GRPOLoop(resumed_config, components, logger)
        await loop.start()
        assert loop.state == first.state
        assert components.buffer.state_dict() == saved_buffer
        assert components.generator.policy_version == 1
        assert components.trainer.step == 1  # the optimizer's state came back with the weights
        await loop.run_sync()
        # Step 2 trains on the 4 samples the checkpoint carried: no new round, the data position stays.
        assert loop.state.step == 2 and loop.state.policy_version == 2
        assert loop.state.next_task == first.state.next_task and loop.state.rounds == first.state.rounds
        assert len(components.buffer) == 0 and components.trainer.step == 2
    finally:
        logger.close()
        await components.close()


async def test_a_fresh_run_replaces_an_earlier_runs_outputs(tmp_path):
    """Without loop.resume, a second run into the same directory reports only itself."""
    local = ["generator.service=false", "env.service.backend=local", "eval.num_tasks=0", "loop.checkpoint_every=1"]
    await train(small_config(tmp_path, *local, "loop.steps=2"))
    notes = tmp_path / "run" / "notes.txt"
    notes.write_text("mine")
    second = await train(small_config(tmp_path, *local, "loop.steps=1"))
    records = read_metrics(second.output_dir / "metrics.jsonl")
    assert [r["kind"] for r in records].count("train") == 1
    # The first run's step-2 checkpoint is gone: a later resume continues the second run.
    assert [p.name for p in (second.output_dir / "checkpoints").iterdir()] == ["step_000001"]
    assert notes.read_text() == "mine"


def test_loading_something_that_is_not_a_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a training checkpoint"):
        load_checkpoint(tmp_path, trainer=None, buffer=None)
    assert latest_checkpoint(tmp_path) is None


async def test_off_policy_correction_curriculum_and_dynamic_sampling_in_a_run(tmp_path):
    """A step with TIS/MIS on and the pass-rate curriculum: the record carries the mismatch and round metrics,
    the checkpoint the curriculum's history; then rounds with dynamic sampling on the real parts."""
    local = ["generator.service=false", "env.service.backend=local", "eval.num_tasks=0",
             "rollout.curriculum.sampler=pass_rate", "rollout.curriculum.kwargs={pool_size: 3, window: 4}"]
    result = await train(small_config(tmp_path, *local, "loop.steps=1", "trainer.config.off_policy.tis=token",
                                      "trainer.config.off_policy.mis=geometric"))
    record = next(r for r in read_metrics(result.output_dir / "metrics.jsonl") if r["kind"] == "train")
    for key in ("mismatch_abs_mean", "mismatch_k3_kl", "tis_truncated_frac", "mis_masked_frac", "is_weight_mean"):
        assert 0 <= record[f"off_policy/{key}"] < float("inf"), key
    # The generator samples with the trainer's weights of that version: a small mismatch, little rejected.
    assert record["off_policy/mismatch_abs_mean"] < 1e-2 and record["off_policy/mis_masked_frac"] < 0.5
    assert record["rollout/dynamic/groups_played"] == 2 and record["rollout/dynamic/passes"] == 1
    saved = json.loads((latest_checkpoint(result.output_dir) / "loop_state.json").read_text())
    history = saved["tasks"]["history"]
    assert history and all(0 <= int(seed) < 3 for seed in history) and saved["next_task"] == 2 * saved["rounds"]

    config = small_config(tmp_path, *local, "advantages.drop_zero_variance=true",
                          "rollout.dynamic_sampling.enabled=true", "rollout.dynamic_sampling.max_rounds=3")
    components = await build_components(config)
    logger = MetricsLogger(tmp_path / "dynamic", tensorboard=False)
    try:
        loop = GRPOLoop(config, components, logger)
        total = 0.0
        for _ in range(2):
            m = await loop.collect_round()
            total += m["rollout/dynamic/groups_played"]
            played, kept = m["rollout/dynamic/groups_played"], m["rollout/dynamic/groups_kept"]
            assert 2 <= played <= 6 and kept + m["rollout/dynamic/groups_dropped"] == played
            assert m["rollout/dynamic/target_met"] == float(kept >= 2)
            assert played == 6 or kept >= 2  # it stops at the target or at the bound
            assert m["rollout/samples_kept"] == 2 * kept  # two episodes a group, only varying groups kept
            assert m["rollout/episodes"] == 2 * played
        assert loop.state.next_task == total and loop.state.tasks["history"]
    finally:
        logger.close()
        await components.close()
