"""HFGenerator with the tiny model: exact tokens/logprobs, sticky sessions, batching, LRU, weight updates."""

import asyncio

import pytest
import torch

from forge_env.generation import (
    Completion,
    Generator,
    HFGenerator,
    HFGeneratorConfig,
    PromptTooLongError,
    SamplingParams,
    SamplingParamsError,
    WeightUpdateError,
)
from forge_env.generation.sampling import sampling_logprobs
from forge_env.models import build_byte_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


@pytest.fixture
def make_generator(model, tokenizer):
    made = []

    def make(config=None, **kwargs):
        generator = HFGenerator(kwargs.pop("model", model), tokenizer, config, **kwargs)
        made.append(generator)
        return generator

    yield make
    for generator in made:
        generator.close()


def prompt(tokenizer, text="What is 2+3?"):
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)[
        "input_ids"
    ]


def recompute(model, prompt_ids, completion, params):
    ids = torch.tensor([prompt_ids + completion.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return logits, sampling_logprobs(logits, [params] * len(completion.token_ids))


async def test_tokens_and_logprobs_match_a_forward_pass(make_generator, model, tokenizer):
    generator = make_generator()
    assert isinstance(generator, Generator)
    ids = prompt(tokenizer)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_tokens=24, seed=7, ignore_eos=True)
    completion = await generator.generate(ids, params)
    assert completion.prompt_ids == ids and len(completion.token_ids) == 24 == len(completion.logprobs)
    assert completion.finish_reason == "length" and completion.policy_version == 0
    _, logprobs = recompute(model, ids, completion, params)
    chosen = logprobs.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    assert torch.isfinite(chosen).all(), "a sampled token was outside the top-k/top-p set"
    assert torch.allclose(chosen, torch.tensor(completion.logprobs), atol=1e-4)
    # the filters really narrowed the distribution the sampler used
    assert bool((logprobs == float("-inf")).all(dim=-1).logical_not().all())
    assert int((logprobs > float("-inf")).sum(dim=-1).max()) <= 40

    greedy = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)  # outgrows the KV buffer twice
    completion = await generator.generate(ids, greedy)
    logits, logprobs = recompute(model, ids, completion, greedy)
    assert completion.token_ids == logits.argmax(-1).tolist()
    raw = logits.log_softmax(-1).gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    assert torch.allclose(raw, torch.tensor(completion.logprobs), atol=1e-4)


async def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(make_generator, tokenizer):
    generator = make_generator()
    ids = prompt(tokenizer)
    params = SamplingParams(max_tokens=20, seed=11, ignore_eos=True)
    alone = await generator.generate(ids, params)
    crowd = await asyncio.gather(
        *(
            generator.generate(prompt(tokenizer, f"q{i}"), SamplingParams(max_tokens=25, seed=i))
            for i in range(4)
        ),
        generator.generate(ids, params),
    )
    assert crowd[-1].token_ids == alone.token_ids
    other = await generator.generate(ids, SamplingParams(max_tokens=20, seed=12, ignore_eos=True))
    assert other.token_ids != alone.token_ids


async def test_second_turn_prefills_only_the_new_suffix(make_generator, tokenizer):
    generator = make_generator()
    first_prompt = prompt(tokenizer)
    params = SamplingParams(max_tokens=16, seed=1)
    first = await generator.generate(first_prompt, params, session_id="episode-1")
    assert first.num_cached_tokens == 0
    observation = tokenizer(
        "\n<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )["input_ids"]
    second_prompt = first_prompt + first.token_ids + observation
    before = generator.stats()
    second = await generator.generate(
        second_prompt, SamplingParams(max_tokens=16, seed=2), session_id="episode-1"
    )
    after = generator.stats()
    assert second.num_cached_tokens == len(first_prompt) + len(first.token_ids)
    assert after["prefilled_tokens"] - before["prefilled_tokens"] == len(observation)
    # the cached path samples exactly what a cold prefill of the whole prompt samples
    cold = await generator.generate(second_prompt, SamplingParams(max_tokens=16, seed=2))
    assert cold.num_cached_tokens == 0
    assert cold.token_ids == second.token_ids
    assert torch.allclose(torch.tensor(cold.logprobs), torch.tensor(second.logprobs), atol=1e-4)


async def test_diverging_prompt_reuses_only_the_common_prefix(make_generator, tokenizer):
    generator = make_generator()
    ids = prompt(tokenizer, "a fairly long question about arithmetic")
    first = await generator.generate(ids, SamplingParams(max_tokens=8, seed=0), session_id="s")
    edited = ids[:10] + tokenizer("something else")["input_ids"]
    second = await generator.generate(edited, SamplingParams(max_tokens=8, seed=0), session_id="s")
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 10
    same = await generator.generate(edited, SamplingParams(max_tokens=8, seed=0))
    assert same.token_ids == second.token_ids


async def test_concurrent_requests_share_decode_steps(make_generator, tokenizer):
    generator = make_generator(HFGeneratorConfig(max_batch_size=8))
    params = [SamplingParams(max_tokens=30, seed=i, ignore_eos=True) for i in range(6)]
    completions = await asyncio.gather(
        *(generator.generate(prompt(tokenizer, f"q{i}"), p) for i, p in enumerate(params))
    )
    stats = generator.stats()
    assert all(len(c.token_ids) == 30 for c in completions)
    assert stats["max_decode_batch"] >= 2
    # one request at a time would need 6 * 29 decode steps
    assert stats["decode_steps"] <= 2 * 30
    assert stats["decode_rows"] == 6 * 29


async def test_session_lru_evicts_the_least_recently_used(make_generator, tokenizer):
    generator = make_generator(HFGeneratorConfig(max_sessions=2))
    params = SamplingParams(max_tokens=4, seed=0)
    history = {}
    for session in ["a", "b", "c"]:
        ids = prompt(tokenizer, session)
        history[session] = ids + (await generator.generate(ids, params, session_id=session)).token_ids
    await generator.wait_idle()
    assert generator.sessions.session_ids() == ["b", "c"]
    assert generator.stats()["session_evictions"] == 1
    revisit_a = await generator.generate(history["a"] + [10], params, session_id="a")
    assert revisit_a.num_cached_tokens == 0
    revisit_c = await generator.generate(history["c"] + [10], params, session_id="c")
    await generator.wait_idle()
    assert revisit_c.num_cached_tokens == len(history["c"])
    assert generator.sessions.session_ids() == ["a", "c"]


async def test_session_memory_bound(make_generator, tokenizer):
    generator = make_generator()
    one = generator  # measure one session's cache size, then bound a second generator below two of them
    await one.generate(prompt(tokenizer), SamplingParams(max_tokens=4, seed=0), session_id="x")
    await one.wait_idle()
    size = one.sessions.nbytes
    bounded = make_generator(HFGeneratorConfig(max_session_cache_bytes=int(size * 1.5)))
    for session in ["x", "y"]:
        await bounded.generate(prompt(tokenizer), SamplingParams(max_tokens=4, seed=0), session_id=session)
    await bounded.wait_idle()
    assert bounded.sessions.session_ids() == ["y"] and bounded.sessions.nbytes <= size * 1.5


async def test_release_session_drops_its_cache(make_generator, tokenizer):
    generator = make_generator()
    ids = prompt(tokenizer)
    first = await generator.generate(ids, SamplingParams(max_tokens=4, seed=0), session_id="s")
    await generator.release_session("s")
    await generator.release_session("never-seen")
    again = await generator.generate(
        ids + first.token_ids + [10], SamplingParams(max_tokens=4), session_id="s"
    )
    assert again.num_cached_tokens == 0


async def test_weight_update_invalidates_caches_and_bumps_version(make_generator, tokenizer):
    weights = {v: build_tiny_model(seed=v).state_dict() for v in (1, 2)}
    generator = make_generator(model=build_tiny_model(0), weight_source=weights.__getitem__)
    ids = prompt(tokenizer)
    params = SamplingParams(max_tokens=10, seed=5, ignore_eos=True)
    first = await generator.generate(ids, params, session_id="s")
    await generator.wait_idle()
    assert first.policy_version == 0 and len(generator.sessions) == 1
    await generator.update_weights(1)
    assert generator.policy_version == 1 and len(generator.sessions) == 0
    second = await generator.generate(ids + first.token_ids, params, session_id="s")
    assert second.policy_version == 1 and second.num_cached_tokens == 0
    reference = make_generator(model=build_tiny_model(1))
    assert second.token_ids == (await reference.generate(ids + first.token_ids, params)).token_ids
    with pytest.raises(WeightUpdateError, match="older"):
        await generator.update_weights(0)
    with pytest.raises(WeightUpdateError, match="missing"):
        await generator.load_state_dict({"model.norm.weight": torch.ones(256)}, 3)

    keeper = make_generator(HFGeneratorConfig(keep_sessions_on_update=True), model=build_tiny_model(0))
    await keeper.generate(ids, params, session_id="s")
    await keeper.load_state_dict(weights[2], version=2)
    assert keeper.policy_version == 2 and len(keeper.sessions) == 1


async def test_weight_update_waits_for_running_requests(make_generator, tokenizer):
    generator = make_generator(model=build_tiny_model(0))
    ids = prompt(tokenizer)
    running = asyncio.create_task(generator.generate(ids, SamplingParams(max_tokens=40, ignore_eos=True)))
    await asyncio.sleep(0.05)
    update = asyncio.create_task(generator.load_state_dict(build_tiny_model(1).state_dict(), 1))
    queued = asyncio.create_task(generator.generate(ids, SamplingParams(max_tokens=5)))
    old, _, new = await asyncio.gather(running, update, queued)
    assert old.policy_version == 0 and len(old.token_ids) == 40
    assert new.policy_version == 1


async def test_stops_and_finish_reasons(make_generator, tokenizer):
    generator = make_generator()
    ids = prompt(tokenizer)
    free = await generator.generate(ids, SamplingParams(max_tokens=30, seed=3, ignore_eos=True))
    stop_at = free.token_ids[5]
    by_id = await generator.generate(
        ids, SamplingParams(max_tokens=30, seed=3, ignore_eos=True, stop_token_ids=[stop_at])
    )
    cut = free.token_ids.index(stop_at) + 1
    assert by_id.finish_reason == "stop" and by_id.stop_reason == stop_at
    assert by_id.token_ids == free.token_ids[:cut]
    assert by_id.text == tokenizer.decode(free.token_ids[: cut - 1], skip_special_tokens=True)

    # a stop string made of two sampled bytes that are printable
    printable = [
        i for i in range(6, 30) if 32 <= free.token_ids[i] < 127 and 32 <= free.token_ids[i + 1] < 127
    ]
    if printable:
        i = printable[0]
        stop = bytes(free.token_ids[i : i + 2]).decode()
        by_str = await generator.generate(
            ids, SamplingParams(max_tokens=30, seed=3, ignore_eos=True, stop=[stop])
        )
        assert by_str.finish_reason == "stop" and by_str.stop_reason == stop
        assert stop not in by_str.text and by_str.token_ids == free.token_ids[: len(by_str.token_ids)]

    eos = tokenizer.eos_token_id
    assert free.finish_reason == "length"
    greedy_eos = await generator.generate(ids, SamplingParams(max_tokens=3, stop_token_ids=[eos]))
    assert len(greedy_eos.token_ids) <= 3


async def test_bad_requests_are_clear_errors(make_generator, tokenizer):
    generator = make_generator(HFGeneratorConfig(max_model_len=64))
    with pytest.raises(PromptTooLongError, match="context window is 64"):
        await generator.generate(list(range(64)), SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await generator.generate([1, 2, 10_000])
    with pytest.raises(ValueError, match="empty"):
        await generator.generate([])
    with pytest.raises(SamplingParamsError, match="generate_n"):
        await generator.generate([1, 2], SamplingParams(n=2))
    with pytest.raises(SamplingParamsError, match="top_p"):
        SamplingParams(top_p=0)
    near_limit = await generator.generate(list(range(60)), SamplingParams(max_tokens=50, ignore_eos=True))
    assert near_limit.finish_reason == "length" and len(near_limit.token_ids) == 4


async def test_generate_n_and_json_round_trip(make_generator, tokenizer):
    generator = make_generator()
    completions = await generator.generate_n(
        prompt(tokenizer), SamplingParams(n=3, seed=0, max_tokens=8, ignore_eos=True)
    )
    assert len(completions) == 3 and len({tuple(c.token_ids) for c in completions}) == 3
    assert Completion.from_dict(completions[0].to_dict()) == completions[0]


async def test_a_weight_store_is_a_weight_source(make_generator, tokenizer, tmp_path):
    from forge_env.weights import WeightStore

    store = WeightStore("generation-test", root=tmp_path / "weights")
    store.put(build_tiny_model(seed=4).state_dict(), version=4)
    generator = make_generator(model=build_tiny_model(0), weight_source=store)
    await generator.update_weights(4)
    ids = prompt(tokenizer)
    params = SamplingParams(max_tokens=6, seed=1, ignore_eos=True)
    loaded = await generator.generate(ids, params)
    reference = make_generator(model=build_tiny_model(4))
    assert loaded.policy_version == 4
    assert loaded.token_ids == (await reference.generate(ids, params)).token_ids


async def test_a_cancelled_request_is_aborted_and_frees_its_session(make_generator, tokenizer):
    generator = make_generator()
    ids = prompt(tokenizer)
    task = asyncio.create_task(
        generator.generate(ids, SamplingParams(max_tokens=2000, ignore_eos=True), session_id="s")
    )
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after = await generator.generate(ids, SamplingParams(max_tokens=3), session_id="s")
    assert after.num_cached_tokens == 0  # the aborted turn's cache was not kept
    assert generator.stats()["generated_tokens"] < 2000
