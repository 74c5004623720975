"""TrainSample validation and JSON round-trip."""

import pytest

from forge_env.rl.types import InvalidSampleError, TrainSample


def _kw(**over):
    kw = dict(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], old_logprobs=[0.0, -0.5, -1.0])
    kw.update(over)
    return kw


def test_json_round_trip_keeps_every_field():
    s = TrainSample(
        **_kw(), advantage=0.5, reward=1.0, ref_logprobs=[-1.0, -0.4, -1.1], policy_versions=[3, 4],
        group_id="g", episode_id="e", metadata={"truncated": "max_turns"},
    )  # fmt: skip
    back = TrainSample.from_json(s.to_json())
    assert back == s
    assert back.min_policy_version == 3 and back.num_loss_tokens == 2


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(loss_mask=[0, 1]), "loss_mask has 2"),
        (dict(old_logprobs=[0.0]), "old_logprobs has 1"),
        (dict(ref_logprobs=[0.0]), "ref_logprobs has 1"),
        (dict(loss_mask=[0, 2, 1]), "only 0 and 1"),
        (dict(loss_mask=[1, 1, 1]), "first token"),
        (dict(token_ids=[], loss_mask=[], old_logprobs=[]), "empty"),
        (dict(advantage=float("nan")), "finite"),
    ],
)
def test_inconsistent_samples_are_rejected(over, match):
    with pytest.raises(InvalidSampleError, match=match):
        TrainSample(**_kw(**over))


def test_unknown_fields_are_rejected():
    with pytest.raises(InvalidSampleError, match="unknown TrainSample fields"):
        TrainSample.from_dict({**_kw(), "logprobs": []})
