"""Advantage modes against hand-computed values; zero-variance groups reported and dropped."""

import math

import pytest

from forge_env.rl.advantages import compute_advantages, group_advantages
from tests.rl_support import sample

approx = pytest.approx


def test_grpo_normalises_by_sample_std():
    # rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    std = math.sqrt(1 / 3)
    assert group_advantages([1, 0, 0, 1], "grpo", eps=0) == approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std])


def test_dr_grpo_is_mean_only():
    assert group_advantages([3.0, 1.0, 2.0], "dr_grpo") == approx([1.0, -1.0, 0.0])


def test_leave_one_out_baseline():
    # r_i - mean(others): 3 - 1.5, 1 - 2.5, 2 - 2
    assert group_advantages([3.0, 1.0, 2.0], "loo") == approx([1.5, -1.5, 0.0])


def test_zero_variance_and_singleton_groups_get_zero():
    for mode in ("grpo", "dr_grpo", "loo"):
        assert group_advantages([0.7, 0.7, 0.7], mode) == [0.0, 0.0, 0.0]
        assert group_advantages([5.0], mode) == [0.0]
    with pytest.raises(ValueError, match="unknown advantage mode"):
        group_advantages([1.0, 0.0], "ppo")  # type: ignore[arg-type]


def _groups():
    return [
        sample([5], [6], reward=1.0, group_id="a", episode_id="a0"),
        sample([5], [7], reward=0.0, group_id="a", episode_id="a1"),
        sample([8], [9], reward=1.0, group_id="b", episode_id="b0"),
        sample([8], [9], reward=1.0, group_id="b", episode_id="b1"),
    ]


def test_compute_advantages_sets_in_place_and_reports_zero_variance():
    samples = _groups()
    result = compute_advantages(samples, "dr_grpo")
    assert [s.advantage for s in samples] == approx([0.5, -0.5, 0.0, 0.0])
    assert result.zero_variance_groups == ["b"]
    assert result.dropped == 0 and len(result.samples) == 4
    assert result.metrics["advantages/zero_variance_frac"] == 0.5
    assert result.metrics["advantages/reward_mean"] == 0.75


def test_compute_advantages_drops_zero_variance_groups_when_asked():
    result = compute_advantages(_groups(), "grpo", drop_zero_variance=True)
    assert [s.episode_id for s in result.samples] == ["a0", "a1"]
    assert result.dropped == 2
    assert result.samples[0].advantage > 0 > result.samples[1].advantage


def test_group_id_is_required():
    with pytest.raises(ValueError, match="group_id"):
        compute_advantages([sample([1], [2], reward=1.0)])
