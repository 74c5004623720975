"""The HF generator's CPU speed-ups change no completion: grouped-query attention without copies
(``gqa_attention``) and the prompt prefix cache (``prompt_prefix_cache``).

The demo's rollouts are seeded per episode, so "the same completions" is checkable: the same tokens
and the same sampler logprobs for the same prompts and seeds, with and without each speed-up.
"""

import asyncio
import copy

import pytest
import torch

from forge_env.generation import HFGenerator, HFGeneratorConfig, SamplingParams
from forge_env.generation.gqa_attention import NAME, use_gqa_attention
from forge_env.generation.kv_cache import cache_from_layers
from forge_env.models import build_byte_tokenizer, build_tiny_model

QUESTIONS = ["What is 12+7?", "What is 93*41?", "What is 5-68?", "What is 70*70?"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def _prompt(tokenizer, question):
    messages = [{"role": "system", "content": "Tools:\ncalculator(expression: string)"},
                {"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


async def _complete(generator, prompts, *, seed=3):
    params = [SamplingParams(temperature=1.0, max_tokens=24, seed=seed + i, ignore_eos=True) for i in range(len(prompts))]
    return await asyncio.gather(*(generator.generate(p, s, session_id=f"s{seed + i}")
                                  for i, (p, s) in enumerate(zip(prompts, params, strict=True))))


def test_gqa_attention_gives_the_same_logits_bit_for_bit_in_prefill_and_a_padded_decode_step():
    plain = build_tiny_model(0)
    fast = copy.deepcopy(plain)
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads
    assert use_gqa_attention(fast) and fast.config._attn_implementation == NAME
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 250, (3, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # left padding, as the generator's running batch has
    mask[2, :3] = 0
    outputs = []
    for model in (plain, fast):
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            cache = cache_from_layers([(layer.keys, layer.values) for layer in out.past_key_values.layers])
            step = model(input_ids=ids[:, -1:], attention_mask=torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1),
                         past_key_values=cache, use_cache=True)
        outputs.append((out.logits, step.logits))
    assert torch.equal(outputs[0][0], outputs[1][0])
    assert torch.equal(outputs[0][1], outputs[1][1])


def test_gqa_attention_leaves_a_model_without_grouped_heads_alone():
    from forge_env.models import TinyModelConfig

    model = build_tiny_model(0, TinyModelConfig(num_attention_heads=4, num_key_value_heads=4))
    assert not use_gqa_attention(model)
    assert model.config._attn_implementation == "sdpa"


async def test_the_generator_s_completions_do_not_depend_on_gqa_attention(tokenizer):
    prompts = [_prompt(tokenizer, q) for q in QUESTIONS]
    results = []
    for gqa in (False, True):
        generator = HFGenerator(build_tiny_model(0), tokenizer, HFGeneratorConfig(max_batch_size=8, gqa_attention=gqa))
        try:
            results.append(await _complete(generator, prompts))
            assert (generator.model.config._attn_implementation == NAME) == gqa
        finally:
            generator.close()
    for plain, fast in zip(*results, strict=True):
        assert fast.token_ids == plain.token_ids
        assert fast.logprobs == plain.logprobs


async def test_the_prompt_prefix_cache_prefills_only_what_a_fresh_prompt_does_not_share(tokenizer):
    prompts = [_prompt(tokenizer, q) for q in QUESTIONS]
    shared = next(i for i, (a, b) in enumerate(zip(prompts[0], prompts[1], strict=False)) if a != b)
    assert shared >= 16
    results, stats = [], []
    for cache in (False, True):
        generator = HFGenerator(build_tiny_model(0), tokenizer,
                                HFGeneratorConfig(max_batch_size=1, prompt_prefix_cache=cache))
        try:
            results.append([(await _complete(generator, [p], seed=3 + i))[0] for i, p in enumerate(prompts)])
            stats.append(generator.stats())
        finally:
            generator.close()
    (plain, cached), (plain_stats, cached_stats) = results, stats
    assert [c.num_cached_tokens for c in plain] == [0, 0, 0, 0]
    assert cached[0].num_cached_tokens == 0 and all(c.num_cached_tokens >= shared for c in cached[1:])
    assert cached_stats["prefix_hits"] == 3 and plain_stats["prefix_hits"] == 0
    assert cached_stats["prefilled_tokens"] == plain_stats["prefilled_tokens"] - sum(c.num_cached_tokens for c in cached)
    for a, b in zip(plain, cached, strict=True):
        assert b.token_ids == a.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)


async def test_the_prompt_prefix_cache_is_dropped_with_the_weights_and_needs_a_long_enough_share(tokenizer):
    weights = {1: build_tiny_model(seed=1).state_dict()}
    generator = HFGenerator(build_tiny_model(0), tokenizer, HFGeneratorConfig(prompt_prefix_cache=True),
                            weight_source=weights.__getitem__)
    try:
        first, second = _prompt(tokenizer, QUESTIONS[0]), _prompt(tokenizer, QUESTIONS[1])
        await _complete(generator, [first])
        await generator.update_weights(1)
        # Keys and values of the old weights are never reused: the next fresh prompt is prefilled whole.
        after_update = (await _complete(generator, [second], seed=5))[0]
        assert after_update.num_cached_tokens == 0
        reference = HFGenerator(build_tiny_model(1), tokenizer, HFGeneratorConfig())
        try:
            assert after_update.token_ids == (await _complete(reference, [second], seed=5))[0].token_ids
        finally:
            reference.close()
        # A prompt that shares fewer than min_prompt_prefix tokens with the cached one starts from scratch.
        other = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)["input_ids"]
        assert (await _complete(generator, [other], seed=7))[0].num_cached_tokens == 0
        assert generator.stats()["prefix_hits"] == 0
    finally:
        generator.close()
