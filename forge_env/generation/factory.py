"""``make_generator``: a generator from a backend name and its options, beside ``make_sandbox``.

    generator = make_generator("hf", model="forge_env/tiny", config={"max_batch_size": 8})   # loads it
    generator = make_generator("hf", model=model, tokenizer=tokenizer)     # wraps a loaded model as it is
    generator = make_generator("vllm", model="/checkpoints/run-1", config={"gpu_memory_utilization": 0.5})
    generator = make_generator("completions", config=EndpointConfig(base_url=..., model=...), vocab_size=n)

Backends are a small registry, name -> factory (:func:`register_generator` adds one). Each factory imports
its backend when it is called, so importing this module (or choosing ``hf``) never pulls vLLM, and choosing
``completions`` never pulls torch. ``config`` is the backend's config object or a mapping of its fields
(``HFGeneratorConfig``, ``VLLMGeneratorConfig``, ``EndpointConfig``).

A ``GeneratorService`` (replicas in their own processes) is a deployment of these backends, not a backend:
its replicas build their generator with ``make_generator`` too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from forge_env.generation.base import Generator

GeneratorFactory = Callable[..., Generator]

_BACKENDS: dict[str, GeneratorFactory] = {}

__all__ = ["GeneratorFactory", "generator_backends", "make_generator", "register_generator"]


def register_generator(name: str, factory: GeneratorFactory | None = None) -> Any:
    """Register ``factory(**options) -> Generator`` as backend ``name`` (also usable as a decorator)."""
    def add(factory: GeneratorFactory) -> GeneratorFactory:
        _BACKENDS[name] = factory
        return factory

    return add if factory is None else add(factory)


def generator_backends() -> list[str]:
    """The registered backend names."""
    return sorted(_BACKENDS)


def make_generator(backend: str = "hf", **options: Any) -> Generator:
    """Create a generator of ``backend``; ``options`` are that backend's (see the module docstring)."""
    try:
        factory = _BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown generator backend {backend!r}; choose one of {generator_backends()}") from None
    return factory(**options)


def _config(cls: type, config: Any, **defaults: Any) -> Any:
    """``config`` as a ``cls``: kept if it is one, else built from its mapping (``defaults`` fill gaps)."""
    if isinstance(config, cls):
        return config
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be a {cls.__name__} or a mapping of its fields, got {type(config).__name__}")
    return cls(**{**defaults, **(config or {})})


@register_generator("hf")
def _hf(model: Any, tokenizer: Any = None, config: Any = None, *, device: str | None = None, dtype: Any = None,
        seed: int = 0, weight_source: Any = None, policy_version: int = 0) -> Generator:
    """transformers, CPU or GPU. ``model``: a checkpoint path or hub id (loaded here, with its tokenizer, on
    ``device``/``dtype``, the tiny model's weights from ``seed``), or a loaded model with its ``tokenizer``."""
    from forge_env.generation.hf import HFGenerator, HFGeneratorConfig

    config = _config(HFGeneratorConfig, config)
    if isinstance(model, str | os.PathLike):
        if tokenizer is not None or policy_version:
            raise TypeError("a checkpoint path loads its own tokenizer and starts at policy_version 0")
        return HFGenerator.from_pretrained(str(model), config, device=device, dtype=dtype, seed=seed,
                                           weight_source=weight_source)
    if tokenizer is None:
        raise TypeError("a loaded model needs its tokenizer (make_generator('hf', model=m, tokenizer=t))")
    if device is not None or dtype is not None:
        raise TypeError("device and dtype apply to a checkpoint path; move a loaded model yourself")
    return HFGenerator(model, tokenizer, config, weight_source=weight_source, policy_version=policy_version)


@register_generator("vllm")
def _vllm(model: str | os.PathLike, config: Any = None, *, device: str | None = None, weight_source: Any = None,
          policy_version: int = 0) -> Generator:
    """vLLM's engine, CPU or GPU. ``model``: a checkpoint directory (vLLM loads from disk) or a model id
    (``forge-env models list``: its pulled directory); ``device`` (``cuda:0`` counts as ``cuda``) is the config's
    unless it names one."""
    from forge_env.generation.vllm import VLLMGenerator, VLLMGeneratorConfig
    from forge_env.models import resolve_model

    if isinstance(config, VLLMGeneratorConfig):
        vllm_config = config
    else:
        fields = dict(config or {})
        if device is not None:
            fields.setdefault("device", device.split(":")[0])
        vllm_config = VLLMGeneratorConfig(model=resolve_model(model), **fields)
    return VLLMGenerator(vllm_config, weight_source=weight_source, policy_version=policy_version)


@register_generator("completions")
def _completions(config: Any, *, vocab_size: int | None = None, policy_version: int = 0) -> Generator:
    """A model behind an OpenAI-compatible ``/v1/completions`` server (token ids in, ids and logprobs out)."""
    from forge_env.generation.endpoints import CompletionsGenerator, EndpointConfig

    return CompletionsGenerator(_config(EndpointConfig, config), policy_version=policy_version,
                                vocab_size=vocab_size)
