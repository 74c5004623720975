"""Checks of a running ``VLLMGenerator`` on the tiny model, shared by the CPU tests and the ``gpu`` tests.

Version ``v`` of the weights is the tiny model initialised with seed ``v``; every check compares the
sampler's logprobs with a transformers forward pass of the weights the generator claims to serve.
"""

from __future__ import annotations

import pytest
import torch

from forge_env.generation import SamplingParams, WeightUpdateError
from forge_env.generation.sampling import sampling_logprobs
from forge_env.models import build_tiny_model, save_tiny_model
from forge_env.weights import WeightStore

PARAMS = SamplingParams(temperature=0.9, top_k=50, max_tokens=12, seed=3, ignore_eos=True)
PROMPT = [(7 * i + 3) % 250 for i in range(70)]
_MODELS: dict[int, torch.nn.Module] = {}


def tiny(version: int) -> torch.nn.Module:
    if version not in _MODELS:
        _MODELS[version] = build_tiny_model(seed=version).eval()
    return _MODELS[version]


def forward_logprobs(version: int, prompt: list[int], token_ids: list[int], params: SamplingParams) -> torch.Tensor:
    """The sampler's logprobs of ``token_ids`` after ``prompt`` recomputed with weights ``version``."""
    with torch.no_grad():
        logits = tiny(version)(torch.tensor([prompt + token_ids])).logits[0, len(prompt) - 1 : -1].float()
    chosen = torch.tensor(token_ids)[:, None]
    return sampling_logprobs(logits, [params] * len(token_ids)).gather(-1, chosen)[:, 0]


async def assert_serves(generator, version: int, *, atol: float = 1e-4, prompt: list[int] = PROMPT) -> None:
    """``generator`` samples from weights ``version``: policy version and logprobs both say so."""
    completion = await generator.generate(prompt, PARAMS)
    assert generator.policy_version == version == completion.policy_version
    assert len(completion.token_ids) == PARAMS.max_tokens == len(completion.logprobs)
    expected = forward_logprobs(version, prompt, completion.token_ids, PARAMS)
    diff = (expected - torch.tensor(completion.logprobs)).abs().max().item()
    assert diff <= atol, f"logprobs differ from a forward pass of version {version} by {diff}"


def _no_state_dict_copies(state_dict, version):
    raise AssertionError(f"version {version} went through a state dict, not the store's file")


async def check_four_updates(generator, tmp_path, *, first: int = 1, atol: float = 1e-4) -> None:
    """Four updates in a row through every route: state dict, WeightStore file, checkpoint directory
    (no ``lm_head.weight``: the tied head must follow the embedding), state dict without the head."""
    store = WeightStore(f"vllm-test-{first}", root=tmp_path / "store", keep_versions=2)
    source = generator.weight_source
    try:
        v = first
        await generator.load_state_dict(tiny(v).state_dict(), v)
        await assert_serves(generator, v, atol=atol)

        v += 1
        store.put(tiny(v).state_dict(), v)
        generator.weight_source = store  # a WeightFileSource: the workers map the store's file themselves
        generator._write_scratch = _no_state_dict_copies  # so no state dict is written out in this process
        try:
            await generator.update_weights(v)
        finally:
            del generator._write_scratch
        await assert_serves(generator, v, atol=atol)

        v += 1
        await generator.load_state_dict(save_tiny_model(tmp_path / f"v{v}", seed=v), v)
        await assert_serves(generator, v, atol=atol)

        v += 1
        headless = {k: t for k, t in tiny(v).state_dict().items() if k != "lm_head.weight"}
        await generator.load_state_dict(headless, v)
        await assert_serves(generator, v, atol=atol)
    finally:
        generator.weight_source = source
        store.clear()


async def check_bad_weights_are_refused(generator, tmp_path, *, atol: float = 1e-4) -> None:
    """Weights that do not fit are refused before loading, with the reason; the old version serves on."""
    version = generator.policy_version
    good = tiny(version + 1).state_dict()
    wrong_shape = {**good, "model.norm.weight": torch.ones(3)}
    missing = {k: t for k, t in good.items() if k != "model.layers.1.mlp.up_proj.weight"}
    unknown = {**good, "model.layers.9.mlp.up_proj.weight": torch.ones(2, 2)}
    integer = {**good, "model.norm.weight": torch.ones(256, dtype=torch.int32)}
    truncated = save_tiny_model(tmp_path / "truncated", seed=version + 1) / "model.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:-1000])
    cases = [(wrong_shape, "wrong shapes"), (missing, "missing 1"), (unknown, "unknown names"),
             (integer, "not float32"), (truncated.parent, "truncated"), (tmp_path / "nowhere", "no safetensors")]
    for weights, reason in cases:
        try:
            await generator.load_state_dict(weights, version + 1)
        except WeightUpdateError as exc:
            assert reason in str(exc), f"{reason!r} not in {exc}"
        else:
            raise AssertionError(f"weights with {reason} were loaded")
        await assert_serves(generator, version, atol=atol)


async def check_rollback_of_a_failed_load(generator, *, atol: float = 1e-4) -> None:
    """A load that fails half way (``tests.vllm_faults``) is rolled back: the old version serves on."""
    version = generator.policy_version
    for after in (3, 20):  # inside the first layer; past several layers
        await generator.engine.collective_rpc("forge_fail_next_load", args=(after,))
        with pytest.raises(WeightUpdateError, match=f"injected failure after {after} tensors.*still serving version {version}"):
            await generator.load_state_dict(tiny(version + 1).state_dict(), version + 1)
        await assert_serves(generator, version, atol=atol)
    await generator.load_state_dict(tiny(version + 1).state_dict(), version + 1)  # and it still updates
    await assert_serves(generator, version + 1, atol=atol)


async def check_sessions_and_cache_reset(generator, block: int) -> None:
    """Each turn of a session finds the whole blocks of everything before it in the prefix cache; a weight
    update resets the cache, unless ``keep_cache_on_update``."""
    version = generator.policy_version
    params = SamplingParams(temperature=1.0, max_tokens=20, seed=1, ignore_eos=True)
    prompt = [(11 * i + 5) % 250 for i in range(90)]
    turn = await generator.generate(prompt, params, session_id="episode-1")
    assert turn.num_cached_tokens == 0
    for index in range(3):  # each turn appends the sampled tokens and an observation
        shared = len(prompt) + len(turn.token_ids) - 1  # the last sampled token has no KV yet
        prompt = prompt + turn.token_ids + [(13 * i + index) % 250 for i in range(40)]
        turn = await generator.generate(prompt, params, session_id="episode-1")
        assert turn.num_cached_tokens >= shared // block * block > 0, (index, turn.num_cached_tokens, shared)
        assert turn.num_cached_tokens % block == 0

    await generator.load_state_dict(tiny(version + 1).state_dict(), version + 1)
    after_update = await generator.generate(prompt, params, session_id="episode-1")
    assert after_update.num_cached_tokens == 0, "the prefix cache is reset on a weight update"

    generator.config.keep_cache_on_update = True
    try:
        await generator.load_state_dict(tiny(version + 2).state_dict(), version + 2)
        kept = await generator.generate(prompt, params, session_id="episode-1")
        assert kept.num_cached_tokens >= (len(prompt) - 1) // block * block
    finally:
        generator.config.keep_cache_on_update = False
