"""TitanTrainer for real, on the CPU (gloo) here and on GPUs (NCCL, flex attention, bf16) where there are some.

The same tiny Qwen3 goes into TitanTrainer (torchtitan's model, FSDP) and TorchTrainer (transformers):
losses, per-parameter gradients, weights after steps and the LR schedule must agree; two ranks
with FSDP sharding must agree with one; checkpoints restore step and optimizer; pushes have
TorchTrainer's key set and load strictly into a transformers model and an HFGenerator.
"""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from forge_env.models import build_byte_tokenizer, save_tiny_model
from forge_env.rl.losses import LOSSES, get_loss
from forge_env.rl.titan import TitanTrainer, TitanTrainerConfig
from forge_env.rl.trainer import TorchTrainer
from forge_env.weights import WeightStore
from tests.rl_support import LENGTHS, SMALL, batch_of, tiny_model
from tests.titan_ranks import fixed_batch, titan_config

ROOT = Path(__file__).resolve().parents[1]
HAS_GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tests' tiny Qwen3 (tied embeddings) as a HF checkpoint: what TorchTrainer's ``tiny_model()`` holds."""
    return save_tiny_model(tmp_path_factory.mktemp("titan") / "hf", seed=0, config=SMALL)


def make_titan(checkpoint, tmp_path, device="cpu", **overrides) -> TitanTrainer:
    return TitanTrainer(titan_config(checkpoint, tmp_path / "dump", device), **overrides)


def make_torch(device="cpu", **overrides) -> TorchTrainer:
    cfg = titan_config("unused", "unused")
    same = {"loss": cfg.loss, "lr": cfg.lr, "loss_kwargs": cfg.loss_kwargs, "micro_batch_size": cfg.micro_batch_size}
    return TorchTrainer(tiny_model(), device=device, packing=True, precision="fp32", **{**same, **overrides})


def torch_gradients(trainer: TorchTrainer, batch) -> dict[str, torch.Tensor]:
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.compute_loss(batch).loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in trainer.model.named_parameters()}
    trainer.optimizer.zero_grad(set_to_none=True)
    return grads


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def worst_rel_l2(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    assert set(expected) <= set(got), sorted(set(expected) - set(got))
    return max(rel_l2(got[name], expected[name]) for name in expected)


def test_config_checks():
    assert TitanTrainerConfig(packing=False).packing is True
    with pytest.raises(ValueError, match="generator_dtype"):
        TitanTrainerConfig(generator_dtype="int8")
    with pytest.raises(ValueError, match="attn_backend"):
        TitanTrainerConfig(attn_backend="sdpa")
    with pytest.raises(ValueError, match="hf_assets_path"):
        TitanTrainerConfig(flavor="hf")
    with pytest.raises(ValueError, match="device"):
        TitanTrainerConfig(device="cuda:1")


def test_flavor_hf_reads_qwen3_and_llama_checkpoints_and_names_the_fix(checkpoint, tmp_path):
    """flavor='hf' builds torchtitan's qwen3 or llama3 from the checkpoint's config (SmolLM2, a llama, is
    trained in tests/test_real_model_engines.py); a mismatch names the model_name to set."""
    from forge_env.rl.titan_support import hf_model_name, model_spec

    assert hf_model_name(checkpoint, "llama3") == "qwen3" and hf_model_name(tmp_path, "qwen3") == "qwen3"
    with pytest.raises(ValueError, match="model_type='qwen3'; set model_name='qwen3'"):
        model_spec("llama3", "hf", "flex", checkpoint)
    with pytest.raises(ValueError, match="flavor='hf' is available for model_name in"):
        model_spec("deepseek_v3", "hf", "flex", checkpoint)
    llama = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256, "tie_word_embeddings": True,
             "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1e5, "rope_type": "default"}}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    assert hf_model_name(tmp_path, "qwen3") == "llama3"  # what the training app builds for a llama model.path
    config = model_spec("llama3", "hf", "flex", tmp_path).model
    rope = config.layers[0].attention.rope
    assert (rope.theta, rope.scaling, rope.dim, config.enable_weight_tying) == (1e5, "none", 16, True)
    assert config.norm.eps == config.layers[1].ffn_norm.eps == 1e-6
    assert config.layers[0].feed_forward.w1.out_features == 128
    (tmp_path / "config.json").write_text(json.dumps({**llama, "head_dim": 32}))
    with pytest.raises(ValueError, match="head_dim = hidden_size / num_attention_heads"):
        model_spec("llama3", "hf", "flex", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**llama, "rope_parameters": {"rope_type": "llama3"}}))
    with pytest.raises(ValueError, match="rope_type 'llama3' is not supported"):
        model_spec("llama3", "hf", "flex", tmp_path)


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_asking_for_cuda_without_a_gpu_says_so(checkpoint, tmp_path):
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        make_titan(checkpoint, tmp_path, device="cuda")


def test_grpo_step_matches_torch_trainer_loss_grads_and_weights(checkpoint, tmp_path):
    titan, reference = make_titan(checkpoint, tmp_path), make_torch()
    batch = fixed_batch()
    for got, expected in zip(titan.logprobs(batch), reference.logprobs(batch), strict=True):
        assert got == pytest.approx(expected, abs=1e-5)

    assert worst_rel_l2(titan.gradients(batch), torch_gradients(reference, batch)) < 1e-4
    ours, theirs = titan.train_step(batch), reference.train_step(batch)
    assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-6) and ours["kl"] > 0
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
    assert ours["num_micro_batches"] == theirs["num_micro_batches"] == 4
    weights = titan.state_dict_for_generators()
    expected = reference.state_dict_for_generators()
    assert set(weights) == set(expected)  # the tied lm_head.weight included, as TorchTrainer pushes it
    assert worst_rel_l2(weights, expected) < 1e-4
    assert max(rel_l2(weights[n], tiny_model().state_dict()[n]) for n in expected) > 1e-3  # it did move
    titan.close()


def test_every_loss_matches_torch_trainer(checkpoint, tmp_path):
    titan, reference = make_titan(checkpoint, tmp_path), make_torch()
    batch = fixed_batch()
    for name in sorted(LOSSES):
        titan.loss_fn = reference.loss_fn = get_loss(name)
        titan.config.loss_kwargs = reference.config.loss_kwargs = {}
        ours, theirs = titan.compute_loss(batch), reference.compute_loss(batch)
        assert ours.loss.item() == pytest.approx(theirs.loss.item(), abs=1e-6), name
        assert abs(ours.loss.item()) > 1e-4, name  # a loss that is zero here would compare nothing
        assert worst_rel_l2(titan.gradients(batch), torch_gradients(reference, batch)) < 1e-4, name
    titan.close()


def test_lr_schedule_matches_torch_trainer_past_total_steps(checkpoint, tmp_path):
    schedule = {"lr_schedule": "cosine", "warmup_steps": 2, "total_steps": 4, "min_lr_ratio": 0.1}
    schedule.update(loss="sft", loss_kwargs={})
    titan = make_titan(checkpoint, tmp_path, **schedule)
    reference = make_torch(**schedule)
    batch = batch_of(LENGTHS)
    steps = schedule["total_steps"] + 5
    ours = [titan.train_step(batch)["lr"] for _ in range(steps)]
    theirs = [reference.train_step(batch)["lr"] for _ in range(steps)]
    assert ours == pytest.approx(theirs, rel=1e-9)
    assert ours[-1] == pytest.approx(1e-4) and min(ours) > 0  # held at min_lr_ratio * lr after total_steps
    assert worst_rel_l2(titan.state_dict_for_generators(), reference.state_dict_for_generators()) < 1e-4
    titan.close()


def test_save_and_load_restore_step_optimizer_and_weights(checkpoint, tmp_path):
    batch = batch_of(LENGTHS)
    first = make_titan(checkpoint, tmp_path / "a", loss="sft", loss_kwargs={}, lr_schedule="linear", total_steps=10)
    for _ in range(2):
        first.train_step(batch)
    first.save(tmp_path / "ckpt")
    saved_moments = {k: v.clone() for k, v in first.optimizers.optimizers[0].state_dict()["state"][0].items()}
    later = [first.train_step(batch)["lr"] for _ in range(2)]

    second = make_titan(checkpoint, tmp_path / "b", loss="sft", loss_kwargs={}, lr_schedule="linear", total_steps=10)
    second.load(tmp_path / "ckpt")
    assert second.step == 2
    for key, value in second.optimizers.optimizers[0].state_dict()["state"][0].items():
        assert torch.equal(value, saved_moments[key]), key
    assert [second.train_step(batch)["lr"] for _ in range(2)] == later
    assert worst_rel_l2(second.state_dict_for_generators(), first.state_dict_for_generators()) == 0.0
    with pytest.raises(FileNotFoundError, match="not a TitanTrainer checkpoint"):
        second.load(tmp_path / "missing")
    first.close()
    second.close()


def test_pushes_load_strictly_into_transformers_and_an_hf_generator(checkpoint, tmp_path):
    from forge_env.generation import HFGenerator

    store = WeightStore("titan-push", root=tmp_path / "weights")
    titan = make_titan(checkpoint, tmp_path, weight_store=store, loss="sft", loss_kwargs={}, lr=1e-2)
    titan.train_step(batch_of(LENGTHS))
    titan.push_weights(1)
    torch_push = WeightStore("torch-push", root=tmp_path / "torch-weights")
    make_torch(weight_store=torch_push).push_weights(1)
    assert set(store.load(1)) == set(torch_push.load(1))

    fresh = tiny_model(seed=5)
    assert store.load_into(fresh, strict=True) == 1
    generator = HFGenerator(tiny_model(seed=6), build_byte_tokenizer(), weight_source=store)
    try:
        asyncio.run(generator.update_weights(1))
        assert generator.policy_version == 1
        sample_ids = batch_of(LENGTHS)[:1]
        expected = titan.logprobs(sample_ids)[0]
        with torch.no_grad():
            for model in (fresh, generator.model):
                logits = model(torch.tensor([sample_ids[0].token_ids])).logits[0, :-1]
                lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample_ids[0].token_ids[1:])[:, None])
                assert lp[:, 0].tolist() == pytest.approx(expected[1:], abs=1e-5)
    finally:
        generator.close()
    titan.close()


def run_ranks(checkpoint, out: Path, nproc: int, device: str) -> dict:
    """Launch tests/titan_ranks.py on ``nproc`` ranks with torchrun; rank 0's results."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(ROOT / "tests" / "titan_ranks.py"), str(checkpoint), str(out), device]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "metrics.json").read_text())


def check_ranks_match_one_rank(checkpoint, tmp_path, device: str) -> None:
    from safetensors.torch import load_file

    result = run_ranks(checkpoint, tmp_path / "ranks", 2, device)
    assert result["world_size"] == 2 == result["dp_size"]
    assert result["sharded"] == result["params"] > 0  # FSDP really sharded every parameter over both ranks

    one = make_titan(checkpoint, tmp_path / "one", device=device)
    batch = fixed_batch()
    assert worst_rel_l2(load_file(str(tmp_path / "ranks" / "grads.safetensors")), one.gradients(batch)) < 1e-4
    metrics = one.train_step(batch)
    assert result["metrics"]["num_micro_batches"] == 2 and metrics["num_micro_batches"] == 4
    for key, value in metrics.items():  # loss, kl, clip fractions, ratio extremes, entropy, grad_norm, lr, ...
        if key != "num_micro_batches":
            assert result["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    pushed = WeightStore("titan-ranks", root=tmp_path / "ranks" / "weights").load(1)
    assert worst_rel_l2(pushed, one.state_dict_for_generators()) < 1e-4

    # The 2-rank sharded checkpoint loads into one rank (DCP reshards): same step, same weights.
    resumed = make_titan(checkpoint, tmp_path / "resumed", device=device)
    resumed.load(tmp_path / "ranks" / "ckpt")
    assert resumed.step == 1
    assert worst_rel_l2(resumed.state_dict_for_generators(), pushed) == 0.0
    one.close()
    resumed.close()


def test_two_gloo_ranks_with_fsdp_match_one_rank(checkpoint, tmp_path):
    check_ranks_match_one_rank(checkpoint, tmp_path, "cpu")


@pytest.mark.parametrize("recipe", ["grpo_gsm8k.yaml", "coding_agent.yaml"])
def test_gpu_recipe_builds_its_torchtitan_model_and_pushes_what_transformers_loads(recipe):
    """The GPU recipes' trainer section, checked on the CPU: torchtitan has the flavor, seq_len fits it,
    and the pushed key set and shapes are those of the transformers Qwen3 of that shape (meta tensors)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agents.train.config import load_grpo_config
    from forge_env.rl.titan_support import fit_seq_len, hf_state_dict, model_spec

    config = load_grpo_config(ROOT / "examples" / recipe).trainer.titan_config()
    spec = model_spec(config.model_name, config.flavor, "flex")
    fit_seq_len(spec.model, config.seq_len)
    with torch.device("meta"):
        model = spec.model.build()
    pushed = hf_state_dict(model, spec.state_dict_adapter(spec.model, None))
    layer = spec.model.layers[0]
    hf_config = Qwen3Config(
        vocab_size=spec.model.vocab_size, hidden_size=spec.model.dim, num_hidden_layers=len(spec.model.layers),
        num_attention_heads=layer.attention.n_heads, num_key_value_heads=layer.attention.n_kv_heads,
        head_dim=layer.attention.head_dim, intermediate_size=layer.feed_forward.w1.out_features,
        tie_word_embeddings=spec.model.enable_weight_tying,
    )  # fmt: skip
    with torch.device("meta"):
        expected = Qwen3ForCausalLM(hf_config).state_dict()
    assert {k: tuple(v.shape) for k, v in pushed.items()} == {k: tuple(v.shape) for k, v in expected.items()}


# ------------------------------------------------------------------ the CUDA path (flex attention, bf16, NCCL)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_gpu_flex_attention_bf16_matches_torch_trainer_and_learns(checkpoint, tmp_path):
    titan = make_titan(checkpoint, tmp_path, device="cuda", mixed_precision_param="float32")
    assert titan.attn_backend == "flex"
    reference = make_torch(device="cuda")
    batch = fixed_batch()
    for got, expected in zip(titan.logprobs(batch), reference.logprobs(batch), strict=True):
        assert got == pytest.approx(expected, abs=1e-3)  # flex attention vs SDPA, fp32
    assert worst_rel_l2(titan.gradients(batch), torch_gradients(reference, batch)) < 1e-2
    titan.close()

    bf16 = make_titan(checkpoint, tmp_path / "bf16", device="cuda", loss="sft", loss_kwargs={}, lr=3e-3)
    assert bf16.compute_dtype == "bfloat16"
    losses = [bf16.train_step(batch_of(LENGTHS))["loss"] for _ in range(10)]
    assert losses[-1] < losses[0]
    bf16.close()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_nccl_ranks_with_fsdp_match_one_rank(checkpoint, tmp_path):
    check_ranks_match_one_rank(checkpoint, tmp_path, "cuda")
