"""``VLLMGenerator``: vLLM's async engine behind the ``Generator`` protocol (GPU only).

Token in, token out with the sampler's logprobs (``logprobs_mode="processed_logprobs"`` by default, the
same meaning as ``HFGenerator``'s: the distribution after temperature/top-k/top-p). Automatic prefix
caching plays the part of sticky sessions: a turn that extends an earlier prompt finds its blocks in the
cache, and ``num_cached_tokens`` reports how many (block-granular). Session ids are passed to the engine
where it takes them, and to a service's router for replica stickiness. vLLM is imported lazily, so this
module costs nothing until a ``VLLMGenerator`` is built.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_env.generation.base import (
    Completion,
    GenerationError,
    GeneratorBase,
    GeneratorClosedError,
    SamplingParams,
    WeightSource,
)

_LOGPROBS_MODES = {"processed": "processed_logprobs", "raw": "raw_logprobs"}


@dataclass
class VLLMGeneratorConfig:
    """Engine settings; ``engine_kwargs`` go to ``vllm.AsyncEngineArgs`` unchanged."""

    model: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int | None = None
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    keep_cache_on_update: bool = False
    logprobs_mode: str = "processed"
    seed: int = 0
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


class VLLMGenerator(GeneratorBase):
    """Generator on ``vllm.v1.engine.async_llm.AsyncLLM`` with prefix caching and in-place weight updates.

    ``weight_source(version)`` returns a state dict or the path of safetensors weights (preferred for big
    models: workers read the file themselves); ``load_state_dict(state_dict_or_path, version)`` takes one
    directly. Updates wait for running requests, load the weights on every worker, reset the prefix
    cache (unless ``keep_cache_on_update``) and bump ``policy_version``.
    """

    def __init__(
        self,
        config: VLLMGeneratorConfig,
        *,
        weight_source: WeightSource | None = None,
        policy_version: int = 0,
    ) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:  # pragma: no cover - depends on the gpu extra
            raise ImportError(
                "VLLMGenerator needs vLLM: pip install 'forge-env[gpu]' on a CUDA machine"
            ) from exc
        if config.logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {sorted(_LOGPROBS_MODES)}, got {config.logprobs_mode!r}"
            )
        self.config = config
        self.weight_source = weight_source
        self._version = policy_version
        args = AsyncEngineArgs(
            model=str(config.model),
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_model_len=config.max_model_len,
            dtype=config.dtype,
            enable_prefix_caching=config.enable_prefix_caching,
            logprobs_mode=_LOGPROBS_MODES[config.logprobs_mode],
            seed=config.seed,
            worker_extension_cls="forge_env.generation.vllm_worker.ForgeWorkerExtension",
            **config.engine_kwargs,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        self._takes_session_id = "session_id" in inspect.signature(self.engine.generate).parameters
        self._running = 0
        self._updating = False
        self._idle = asyncio.Condition()
        self._closed = False
        self.stats: dict[str, int] = {
            "requests": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
        }

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> Completion:
        """Sample one completion of ``prompt_ids`` (``session_id`` is a routing/cache hint)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        sampling = self._one_sample(sampling)
        if self._closed:
            raise GeneratorClosedError("the generator is closed")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty; render at least one token (e.g. the generation prompt)")
        params = VSamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=max(sampling.top_k, 0),
            max_tokens=sampling.max_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            stop=list(sampling.stop),
            seed=sampling.seed,
            ignore_eos=sampling.ignore_eos,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            logprobs=0,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        kwargs = {"session_id": session_id} if self._takes_session_id and session_id is not None else {}
        async with self._idle:
            await self._idle.wait_for(lambda: not self._updating)
            self._running += 1
            version = self._version
        try:
            final = None
            request_id = f"{session_id or 'req'}-{uuid.uuid4().hex[:12]}"
            async for output in self.engine.generate(
                {"prompt_token_ids": prompt}, params, request_id, **kwargs
            ):
                final = output
        finally:
            async with self._idle:
                self._running -= 1
                self._idle.notify_all()
        if final is None or not final.outputs:
            raise GenerationError("vLLM returned no output")
        sample = final.outputs[0]
        token_ids = list(sample.token_ids)
        logprobs = [
            entry[token].logprob for entry, token in zip(sample.logprobs or [], token_ids, strict=True)
        ]
        cached = int(getattr(final, "num_cached_tokens", 0) or 0)
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += len(prompt)
        self.stats["cached_tokens"] += cached
        self.stats["generated_tokens"] += len(token_ids)
        return Completion(
            prompt_ids=prompt,
            token_ids=token_ids,
            logprobs=logprobs,
            text=sample.text,
            finish_reason=sample.finish_reason or "abort",
            policy_version=version,
            num_cached_tokens=cached,
            stop_reason=sample.stop_reason,
        )

    async def load_state_dict(self, source: Mapping[str, Any] | str | Path, version: int) -> None:
        """Load a state dict (or safetensors path) on every worker once running requests finish."""
        self._check_version(version)
        if isinstance(source, Path):
            source = str(source)
        async with self._idle:
            self._updating = True
            await self._idle.wait_for(lambda: self._running == 0)
        try:
            await self.engine.collective_rpc("forge_load_weights", args=(source,))
            if not self.config.keep_cache_on_update:
                await self.engine.reset_prefix_cache()
            self._version = version
        finally:
            async with self._idle:
                self._updating = False
                self._idle.notify_all()

    async def release_session(self, session_id: str) -> None:
        """Nothing to free: vLLM's prefix cache evicts unused blocks itself."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.shutdown()

    async def aclose(self) -> None:
        self.close()
