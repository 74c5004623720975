"""Collation details: shifted loss layout, row rounding, micro-batch cuts."""

import pytest
import torch

from forge_env.rl.batching import collate, split_micro_batches
from forge_env.rl.logprobs import model_token_logprobs
from tests.rl_support import sample, tiny_model


def _samples():
    return [sample([3, 4], [5, 6, 7], old_logprobs=[0, 0, -1.0, -2.0, -3.0], advantage=2.0),
            sample([8], [9], old_logprobs=[0, -0.5], advantage=-1.0)]  # fmt: skip


def test_loss_tensors_are_shifted_by_one_token():
    _, lt = collate(_samples())
    assert lt.loss_mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    assert lt.old_logprobs.tolist() == [[0, -1.0, -2.0, -3.0], [-0.5, 0, 0, 0]]
    assert lt.advantages.tolist() == [2.0, -1.0] and lt.lengths.tolist() == [5, 2]
    assert lt.ref_logprobs is None


@pytest.mark.parametrize("packing", [False, True])
def test_rounding_rows_up_changes_no_logprob(packing):
    model = tiny_model()
    samples = _samples()
    with torch.no_grad():
        plain, _ = model_token_logprobs(model, collate(samples, packing=packing)[0])
        inputs, _ = collate(samples, packing=packing, pad_to_multiple=16, pad_token_id=7)
        assert inputs.input_ids.shape[1] % 16 == 0
        rounded, _ = model_token_logprobs(model, inputs)
    _, lt = collate(samples)
    mask = lt.loss_mask.bool()
    assert torch.allclose(plain[mask], rounded[mask], atol=1e-5)


def test_split_micro_batches_by_count_and_tokens():
    samples = [sample([1] * n, [2]) for n in (3, 3, 9, 1)]  # lengths 4, 4, 10, 2
    assert [len(c) for c in split_micro_batches(samples, 2)] == [2, 2]
    # Packed cost is the sum of lengths: 4 + 4, then 10 + 2 fits 12 but not 11.
    assert [len(c) for c in split_micro_batches(samples, 8, max_tokens=12, packing=True)] == [2, 2]
    assert [len(c) for c in split_micro_batches(samples, 8, max_tokens=11, packing=True)] == [2, 1, 1]
    # Padded cost is count x longest: 4 + 4 -> 8; adding the 10 would cost 30; 10 + 2 -> 20.
    assert [len(c) for c in split_micro_batches(samples, 8, max_tokens=20)] == [2, 2]
    assert [len(c) for c in split_micro_batches(samples, 8, max_tokens=19)] == [2, 1, 1]
    with pytest.raises(ValueError, match="micro_batch_size"):
        split_micro_batches(samples, 0)
