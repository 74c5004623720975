"""TorchTrainer and ReferenceModel on a tiny random Qwen3: padding/packing equivalence,
gradient accumulation, learning on a fixed batch, GRPO direction, checkpoints, weight push."""

import math

import pytest
import torch

from forge_env.rl.reference import ReferenceModel
from forge_env.rl.trainer import TorchTrainer, TrainerConfig, lr_lambda
from forge_env.weights import WeightStore
from tests.rl_support import LENGTHS, batch_of, on_policy, sample, tiny_model


def test_padded_packed_and_single_sample_logprobs_agree():
    samples = batch_of(LENGTHS)
    padded = TorchTrainer(tiny_model(), loss="sft", device="cpu", micro_batch_size=4).logprobs(samples)
    packed = TorchTrainer(tiny_model(), loss="sft", device="cpu", packing=True).logprobs(samples)
    other_pad = TorchTrainer(tiny_model(), loss="sft", device="cpu", pad_token_id=77).logprobs(samples)
    alone = [TorchTrainer(tiny_model(), loss="sft", device="cpu").logprobs([s])[0] for s in samples]
    for i, s in enumerate(samples):
        assert len(padded[i]) == s.num_tokens and padded[i][0] == 0.0
        for got in (padded[i], packed[i], other_pad[i]):
            assert got == pytest.approx(alone[i], abs=1e-5)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_micro_batching_and_packing_do_not_change_the_gradient(aggregation):
    results = []
    for micro, packing in [(4, False), (1, False), (2, True)]:
        trainer = TorchTrainer(
            tiny_model(), device="cpu", loss="ppo", micro_batch_size=micro, packing=packing,
            loss_kwargs={"aggregation": aggregation}, max_grad_norm=None,
        )  # fmt: skip
        samples = on_policy(trainer, batch_of(LENGTHS))
        m = trainer.train_step(samples)
        results.append((m["loss"], m["grad_norm"], m["num_micro_batches"]))
    (loss0, norm0, _), *rest = results
    assert norm0 > 0
    for loss, norm, _ in rest:
        assert loss == pytest.approx(loss0, abs=1e-6)
        assert norm == pytest.approx(norm0, rel=1e-4)
    assert [r[2] for r in results] == [1, 4, 2]


def test_sft_loss_falls_on_a_fixed_batch():
    trainer = TorchTrainer(tiny_model(), device="cpu", loss="sft", lr=3e-3, micro_batch_size=2)
    samples = batch_of(LENGTHS)
    losses = [trainer.train_step(samples)["loss"] for _ in range(25)]
    assert losses[-1] < 0.5 * losses[0]
    assert trainer.step == 25


def test_grpo_loss_falls_on_a_fixed_batch():
    trainer = TorchTrainer(tiny_model(), device="cpu", loss="grpo", lr=1e-3, loss_kwargs={"kl_coef": 0.0})
    samples = on_policy(trainer, batch_of(LENGTHS))
    metrics = [trainer.train_step(samples) for _ in range(8)]
    assert metrics[0]["loss"] == pytest.approx(0.0, abs=1e-6)  # ratio 1, advantages sum to 0 per token-mean
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.01
    assert metrics[-1]["clip_frac"] > 0  # it moved far enough to hit the clip
    assert all(math.isfinite(m["entropy"]) for m in metrics)


def test_grpo_step_raises_logprob_of_positive_advantage_completion():
    trainer = TorchTrainer(tiny_model(), device="cpu", loss="grpo", lr=1e-3, loss_kwargs={"kl_coef": 0.0})
    prompt = [5, 17, 42, 9]
    good = sample(prompt, [100, 101, 102, 1], advantage=1.0, group_id="p")
    bad = sample(prompt, [200, 201, 202, 1], advantage=-1.0, group_id="p")
    on_policy(trainer, [good, bad])

    def completion_logprob(s):
        return sum(lp for lp, m in zip(trainer.logprobs([s])[0], s.loss_mask, strict=True) if m)

    before = completion_logprob(good), completion_logprob(bad)
    trainer.train_step([good, bad])
    after = completion_logprob(good), completion_logprob(bad)
    assert after[0] > before[0]
    assert after[1] < before[1]


def test_reference_model_is_frozen_and_feeds_the_kl_term():
    model = tiny_model()
    reference = ReferenceModel(model, device="cpu")
    trainer = TorchTrainer(model, device="cpu", loss="grpo", lr=1e-2, loss_kwargs={"kl_coef": 0.1})
    samples = batch_of(LENGTHS)
    with pytest.raises(ValueError, match="ref_logprobs"):
        trainer.train_step(samples)
    reference.annotate(samples)
    on_policy(trainer, samples)
    first = trainer.train_step(samples)
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference at the start
    for _ in range(3):
        last = trainer.train_step(samples)
    assert last["kl"] > 1e-4
    # The trainer moved `model`; the reference kept its own copy.
    for again, s in zip(reference.logprobs(samples), samples, strict=True):
        assert again == pytest.approx(s.ref_logprobs, abs=1e-6)
    assert not any(p.requires_grad for p in reference.model.parameters())


def test_save_and_load_resume_exactly(tmp_path):
    cfg = TrainerConfig(loss="sft", lr=1e-3, lr_schedule="cosine", warmup_steps=1, total_steps=6, device="cpu")
    samples = batch_of(LENGTHS)
    a = TorchTrainer(tiny_model(), cfg)
    for _ in range(2):
        a.train_step(samples)
    a.save(tmp_path / "ckpt")
    expected_rand = torch.rand(3)
    for _ in range(2):
        a.train_step(samples)

    b = TorchTrainer(tiny_model(seed=123), cfg)
    b.load(tmp_path / "ckpt")
    assert b.step == 2
    assert torch.equal(torch.rand(3), expected_rand)  # RNG state restored
    for _ in range(2):
        b.train_step(samples)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert a.optimizer.param_groups[0]["lr"] == b.optimizer.param_groups[0]["lr"]
    with pytest.raises(FileNotFoundError, match="not a TorchTrainer checkpoint"):
        b.load(tmp_path / "missing")


def test_push_weights_reaches_a_fresh_model(tmp_path):
    store = WeightStore("trainer-test", root=tmp_path / "weights")
    trainer = TorchTrainer(tiny_model(), device="cpu", loss="sft", lr=1e-2, weight_store=store)
    trainer.train_step(batch_of(LENGTHS))
    info = trainer.push_weights(1)
    assert info.version == 1 and store.latest_version() == 1
    fresh = tiny_model(seed=99)
    assert store.load_into(fresh) == 1
    x = torch.tensor([[3, 4, 5, 6]])
    trainer.model.eval()
    assert torch.allclose(fresh(x).logits, trainer.model(x).logits)
    with pytest.raises(RuntimeError, match="weight_store"):
        TorchTrainer(tiny_model(), device="cpu").push_weights(0)


def test_bf16_autocast_runs_on_cpu():
    trainer = TorchTrainer(tiny_model(), device="cpu", precision="bf16", loss="sft", lr=1e-3)
    m = trainer.train_step(batch_of(LENGTHS))
    assert math.isfinite(m["loss"]) and trainer.model.lm_head.weight.dtype == torch.float32


def test_lr_schedules_and_config_errors():
    cos = lr_lambda(TrainerConfig(lr_schedule="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1))
    assert [round(cos(s), 4) for s in (0, 1, 2, 4, 6, 9)] == [0.5, 1.0, 1.0, 0.55, 0.1, 0.1]
    lin = lr_lambda(TrainerConfig(lr_schedule="linear", total_steps=4))
    assert [lin(s) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    with pytest.raises(ValueError, match="total_steps"):
        TrainerConfig(lr_schedule="cosine")
    with pytest.raises(ValueError, match="unknown loss"):
        TrainerConfig(loss="nope")
    with pytest.raises(ValueError, match="empty batch"):
        TorchTrainer(tiny_model(), device="cpu").train_step([])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_trainer_on_gpu_bf16_matches_cpu_direction():
    trainer = TorchTrainer(tiny_model(), device="cuda", loss="sft", lr=3e-3)
    assert trainer.precision == "bf16"
    samples = batch_of(LENGTHS)
    losses = [trainer.train_step(samples)["loss"] for _ in range(10)]
    assert losses[-1] < losses[0]
    cpu = TorchTrainer(tiny_model(), device="cpu", loss="sft").logprobs(samples)
    gpu = TorchTrainer(tiny_model(), device="cuda", loss="sft").logprobs(samples)
    for a, b in zip(cpu, gpu, strict=True):
        assert a == pytest.approx(b, abs=5e-2)  # bf16 autocast vs fp32


class _RunsCodeWhenUnpickled:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_checkpoint_is_data_only_and_a_pickle_in_it_never_runs(tmp_path):
    cfg = TrainerConfig(loss="sft", lr=1e-3, device="cpu")
    trainer = TorchTrainer(tiny_model(), cfg)
    trainer.train_step(batch_of(LENGTHS))
    path = trainer.save(tmp_path / "ckpt")
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "trainer_state.json",
                                                     "trainer_state.safetensors"]
    # A checkpoint from elsewhere carrying a pickle (what trainer_state.pt used to be): loading never unpickles.
    marker = tmp_path / "code-ran"
    torch.save({"step": _RunsCodeWhenUnpickled(marker)}, path / "trainer_state.pt")
    (path / "trainer_state.json").unlink()
    with pytest.raises(FileNotFoundError, match="not a TorchTrainer checkpoint"):
        TorchTrainer(tiny_model(), cfg).load(path)
    assert not marker.exists()
