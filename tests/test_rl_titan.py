"""TitanTrainer: the clear error where it cannot run, and (on a GPU with torchtitan) the same
behaviour as TorchTrainer: HF weights in, matching logprobs, learning, weights out under HF names."""

import importlib.util
import json

import pytest
import torch

from forge_env.rl.titan import TitanTrainer, TitanTrainerConfig, TitanUnavailableError
from forge_env.rl.trainer import TorchTrainer
from forge_env.rl.weight_store import WeightStore
from tests.rl_support import sample

HAS_TITAN = torch.cuda.is_available() and importlib.util.find_spec("torchtitan") is not None


def test_config_forces_packing_and_checks_generator_dtype():
    assert TitanTrainerConfig(packing=False).packing is True
    with pytest.raises(ValueError, match="generator_dtype"):
        TitanTrainerConfig(generator_dtype="int8")


@pytest.mark.skipif(HAS_TITAN, reason="torchtitan and a GPU are present")
def test_unavailable_without_cuda_or_torchtitan():
    with pytest.raises(TitanUnavailableError, match="CUDA|torchtitan"):
        TitanTrainer(TitanTrainerConfig(flavor="debugmodel"))


def _debugmodel_hf_checkpoint(path):
    """A random HF Qwen3 with the shape of torchtitan's qwen3 'debugmodel' flavor."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=2048, hidden_size=256, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    # Both tied names written out, as torchtitan's HF reader expects every key of its state dict.
    save_file({k: v.contiguous().clone() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: "model.safetensors" for k in model.state_dict()}})
    )
    return model


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TITAN, reason="needs a CUDA GPU and torchtitan (pip install 'forge-env[gpu]')")
def test_titan_trainer_matches_hf_learns_and_pushes_hf_weights(tmp_path):
    hf_model = _debugmodel_hf_checkpoint(tmp_path / "hf")
    store = WeightStore("titan-test", root=tmp_path / "weights")
    titan = TitanTrainer(
        TitanTrainerConfig(
            flavor="debugmodel", hf_assets_path=str(tmp_path / "hf"), seq_len=512, loss="grpo", lr=1e-4,
            loss_kwargs={"kl_coef": 0.0}, dump_folder=str(tmp_path / "dump"), generator_dtype=None,
        ),
        weight_store=store,
    )  # fmt: skip
    prompt = [5, 17, 42, 9, 300]
    good = sample(prompt, [100, 101, 102, 1], advantage=1.0, group_id="p")
    bad = sample(prompt, [200, 201, 202, 1], advantage=-1.0, group_id="p")

    reference = TorchTrainer(hf_model, device="cuda", precision="fp32").logprobs([good, bad])
    titan_lp = titan.logprobs([good, bad])
    for a, b in zip(titan_lp, reference, strict=True):
        assert a == pytest.approx(b, abs=5e-2)  # bf16 mixed precision vs fp32

    for s, lp in zip([good, bad], titan_lp, strict=True):
        s.old_logprobs = [v if m else 0.0 for v, m in zip(lp, s.loss_mask, strict=True)]
    before = [sum(v for v, m in zip(lp, s.loss_mask, strict=True) if m) for s, lp in zip([good, bad], titan_lp, strict=True)]
    metrics = titan.train_step([good, bad])
    assert metrics["step"] == 1 and metrics["grad_norm"] > 0
    after_lp = titan.logprobs([good, bad])
    after = [sum(v for v, m in zip(lp, s.loss_mask, strict=True) if m) for s, lp in zip([good, bad], after_lp, strict=True)]
    assert after[0] > before[0] and after[1] < before[1]

    titan.push_weights(1)
    assert store.load_into(hf_model.cuda()) == 1  # strict: HF names and shapes
    pushed = TorchTrainer(hf_model, device="cuda", precision="fp32").logprobs([good, bad])
    for a, b in zip(pushed, after_lp, strict=True):
        assert a == pytest.approx(b, abs=5e-2)

    titan.save(tmp_path / "ckpt")
    titan.train_step([good, bad])
    titan.load(tmp_path / "ckpt")
    assert titan.step == 1
    titan.close()
