"""VLLMGenerator on a GPU with the tiny model (skipped without CUDA and vLLM)."""

import importlib.util

import pytest
import torch

from forge_env.generation import SamplingParams
from forge_env.generation.sampling import sampling_logprobs
from forge_env.models import build_byte_tokenizer, build_tiny_model, save_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
        reason="needs a CUDA GPU and vLLM",
    ),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


async def test_vllm_generator_tokens_logprobs_prefix_cache_and_weight_update(checkpoint):
    from forge_env.generation import VLLMGenerator, VLLMGeneratorConfig

    weights = {1: build_tiny_model(seed=1).state_dict()}
    generator = VLLMGenerator(
        VLLMGeneratorConfig(model=str(checkpoint), gpu_memory_utilization=0.3, dtype="float32"),
        weight_source=weights.__getitem__,
    )
    try:
        tokenizer = build_byte_tokenizer()
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x" * 300}], add_generation_prompt=True
        )["input_ids"]
        params = SamplingParams(temperature=0.9, top_k=50, max_tokens=16, seed=3, ignore_eos=True)
        first = await generator.generate(prompt, params, session_id="s")
        assert len(first.token_ids) == 16 == len(first.logprobs) and first.policy_version == 0

        model = build_tiny_model(0)
        ids = torch.tensor([prompt + first.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        expected = sampling_logprobs(logits, [params] * 16).gather(
            -1, torch.tensor(first.token_ids)[:, None]
        )[:, 0]
        assert torch.allclose(expected, torch.tensor(first.logprobs), atol=1e-2)

        second = await generator.generate(prompt + first.token_ids + prompt[:40], params, session_id="s")
        assert second.num_cached_tokens >= len(prompt) - 16  # block-granular prefix cache hit

        await generator.update_weights(1)
        third = await generator.generate(prompt, params, session_id="s")
        assert generator.policy_version == 1 == third.policy_version
        assert third.num_cached_tokens == 0
    finally:
        generator.close()
