"""Generation: the ``Generator`` protocol and its backends.

``SamplingParams``, ``Completion`` and ``Generator`` import without torch. ``HFGenerator`` (transformers,
CPU or GPU) and ``VLLMGenerator`` (vLLM, CPU or GPU) are imported on first use, as are the endpoint clients
(``CompletionsGenerator``, ``ChatEndpoint``: models behind an OpenAI-compatible server).
``make_generator(backend, **options)`` builds any of them by name (:mod:`forge_env.generation.factory`).
"""

from __future__ import annotations

from typing import Any

from forge_env.generation.base import (
    Completion,
    FinishReason,
    GenerationError,
    Generator,
    GeneratorClosedError,
    PromptTooLongError,
    SamplingParams,
    SamplingParamsError,
    WeightSource,
    WeightUpdateError,
)
from forge_env.generation.factory import generator_backends, make_generator, register_generator

_LAZY = {
    "HFGenerator": "forge_env.generation.hf",
    "HFGeneratorConfig": "forge_env.generation.hf",
    "GeneratorStats": "forge_env.generation.hf",
    "VLLMGenerator": "forge_env.generation.vllm",
    "VLLMGeneratorConfig": "forge_env.generation.vllm",
    "sampling_logprobs": "forge_env.generation.sampling",
    "CompletionsGenerator": "forge_env.generation.endpoints",
    "ChatEndpoint": "forge_env.generation.endpoints",
    "EndpointConfig": "forge_env.generation.endpoints",
    "EndpointError": "forge_env.generation.endpoints",
}

__all__ = [
    "Completion",
    "FinishReason",
    "GenerationError",
    "Generator",
    "GeneratorClosedError",
    "PromptTooLongError",
    "SamplingParams",
    "SamplingParamsError",
    "WeightSource",
    "WeightUpdateError",
    "generator_backends",
    "make_generator",
    "register_generator",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'forge_env.generation' has no attribute {name!r}")
