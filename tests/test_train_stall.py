"""Rounds whose groups all earned equal rewards: skipped, counted and reported, and a run that never finds a
group to train on stops with a reason (``forge-env demo`` exits non-zero) instead of rolling out forever."""

import argparse
import json

import pytest

from agents.train.commands import EXIT_NO_LEARNING_SIGNAL, demo_command
from agents.train.config import load_grpo_config
from agents.train.loop import GRPOLoop
from agents.train.reports import describe_rounds


def test_rounds_without_a_step_are_counted_and_stop_rl_at_the_limit(capsys):
    config = load_grpo_config(None, ["loop.max_rounds_without_step=3", "loop.steps=5"])
    loop = GRPOLoop(config, None, None)  # only the round bookkeeping is exercised

    def round_(kept: int) -> bool:
        """A round of 4 groups of 4 episodes, ``kept`` of them in groups with unequal rewards."""
        loop.state.rounds += 1
        loop.last_round = {"rollout/samples_kept": float(kept), "rollout/reward_mean": 0.0,
                           "advantages/num_groups": 4.0, "advantages/zero_variance_groups": 4.0 - kept / 4}
        return loop.after_round()

    assert not round_(0) and not round_(16)   # a skipped round, then one with trainable groups
    loop.state.step += 1
    loop.rounds_since_step = 0                # what train_step does
    assert not round_(0) and not round_(0)
    assert round_(4)                          # 3 rounds in a row without a step (one gave too little for a batch)
    assert loop.state.rounds == 5 and loop.state.rounds_trainable == 2
    assert "3 rollout rounds in a row without an optimizer step, so RL stopped at step 1 of 5" in loop.rl_stopped
    assert "of 5 rounds, 3 had only groups whose episodes all earned equal rewards" in loop.rl_stopped
    err = capsys.readouterr().err
    assert err.count("nothing to train on, skipped") == 3
    assert describe_rounds(loop.state, 5) == (
        "RL: 1 of 5 steps trained, from 5 rollout rounds: 2 gave trainable groups, 3 skipped (every group's "
        "episodes earned equal rewards; not counted as steps)")
    with pytest.raises(ValueError, match="max_rounds_without_step"):
        load_grpo_config(None, ["loop.max_rounds_without_step=0"])


def test_the_demo_exits_non_zero_when_rl_never_finds_a_group_to_train_on(tmp_path, capsys):
    """The untrained tiny model never answers 2-digit arithmetic right: every group's rewards are 0."""
    overrides = ["sft.enabled=false", "env.service.backend=inprocess", "generator.service=false",
                 "rollout.group_size=2", "rollout.groups_per_step=2", "buffer.batch_size=4",
                 "rollout.sampling.max_tokens=8", "loop.steps=2", "loop.max_rounds_without_step=3",
                 "eval.num_tasks=2", "eval.max_tokens=8", "eval.view_episodes=1", "logging.tensorboard=false",
                 f"loop.output_dir={tmp_path / 'demo'}"]
    code = demo_command(argparse.Namespace(overrides=overrides, print_config=False))
    out, err = capsys.readouterr()
    assert code == EXIT_NO_LEARNING_SIGNAL
    assert "RL: 0 of 2 steps trained, from 3 rollout rounds: 0 gave trainable groups, 3 skipped" in out
    assert "forge-env demo FAILED: RL never found a trainable group" in err
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["rounds_skipped"] == 3 and summary["state"]["step"] == 0
    assert summary["rl_stopped"].startswith("3 rollout rounds in a row without an optimizer step")
    assert summary["success_after"] == summary["success_before"]  # nothing trained: the same weights


async def test_the_async_loop_stops_too_when_no_round_gives_a_batch(tmp_path):
    from agents.train.commands import DEMO_CONFIG
    from agents.train.loop import train

    config = load_grpo_config(DEMO_CONFIG, [
        "sft.enabled=false", "env.service.backend=inprocess", "generator.service=false", "loop.mode=async",
        "rollout.group_size=2", "rollout.groups_per_step=2", "buffer.batch_size=4", "rollout.sampling.max_tokens=8",
        "loop.steps=2", "loop.max_rounds_without_step=2", "eval.num_tasks=0", "logging.tensorboard=false",
        f"loop.output_dir={tmp_path / 'run'}"])
    result = await train(config)
    assert result.state.step == 0 and result.state.rounds == 2 and result.state.rounds_trainable == 0
    assert result.rl_stopped is not None and "RL stopped at step 0 of 2" in result.rl_stopped
