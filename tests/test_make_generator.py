"""``make_generator``: backends by name from a small registry, each imported only when chosen."""

from __future__ import annotations

import subprocess
import sys

import pytest

from forge_env.generation import (
    HFGenerator,
    SamplingParams,
    generator_backends,
    make_generator,
    register_generator,
)
from forge_env.generation.factory import _BACKENDS
from forge_env.models import TINY_MODEL_ID, build_byte_tokenizer, build_tiny_model


def test_the_registry_names_the_backends_and_refuses_unknown_ones():
    assert {"hf", "vllm", "completions"} <= set(generator_backends())
    with pytest.raises(ValueError, match="unknown generator backend 'nope'.*'hf'"):
        make_generator("nope")


async def test_hf_wraps_a_loaded_model_or_loads_a_checkpoint():
    model, tokenizer = build_tiny_model(0), build_byte_tokenizer()
    wrapped = make_generator("hf", model=model, tokenizer=tokenizer, config={"max_batch_size": 2}, policy_version=3)
    loaded = make_generator("hf", model=TINY_MODEL_ID, seed=0)
    try:
        assert isinstance(wrapped, HFGenerator) and wrapped.model is model and wrapped.config.max_batch_size == 2
        assert wrapped.policy_version == 3 and loaded.policy_version == 0
        prompt = tokenizer.encode("2+3=")
        sampling = SamplingParams(temperature=0.0, max_tokens=4)
        assert (await wrapped.generate(prompt, sampling)).token_ids == (await loaded.generate(prompt, sampling)).token_ids
    finally:
        await wrapped.aclose()
        await loaded.aclose()
    with pytest.raises(TypeError, match="tokenizer"):
        make_generator("hf", model=model)


def test_a_registered_backend_is_made_by_name():
    made = object()
    register_generator("test-fixed", lambda **options: (made, options))
    try:
        assert make_generator("test-fixed", x=1) == (made, {"x": 1})
    finally:
        del _BACKENDS["test-fixed"]


def test_choosing_a_backend_imports_only_that_backend():
    code = ("import sys\nfrom forge_env.generation import make_generator\n"
            "from forge_env.generation.endpoints import EndpointConfig\n"
            "g = make_generator('completions', config={'base_url': 'http://127.0.0.1:9', 'model': 'm'}, vocab_size=8)\n"
            "print(type(g).__name__, 'vllm' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["CompletionsGenerator", "False", "False"]
