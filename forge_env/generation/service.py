"""Generation as a service: ``GeneratorActor`` replicas and the ``GeneratorService`` client.

    gen = await GeneratorService.launch(TINY_MODEL_ID, num_replicas=2)
    completion = await gen.generate(prompt_ids, SamplingParams(max_tokens=64), session_id="episode-7")
    await gen.update_weights(3)          # every replica loads version 3 from its weight source
    await gen.release_session("episode-7")
    await gen.shutdown()

``GeneratorService`` implements the ``Generator`` protocol, so rollout code takes it wherever it takes an
``HFGenerator``. Calls without a session id are routed to one healthy replica (load balanced); calls with
a session id are pinned by the service to one replica, the replica whose generator holds that session's
KV cache; releasing the session frees the cache there. Importing this module imports Monarch.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from forge_env.generation.base import (
    Completion,
    GeneratorBase,
    SamplingParams,
    WeightSource,
    WeightUpdateError,
)
from forge_env.generation.factory import make_generator
from forge_env.services import ForgeActor, Service, ServiceError, concurrent_endpoint, endpoint


class GeneratorActor(ForgeActor):
    """One generator replica: builds an ``HFGenerator`` (or a ``VLLMGenerator``) in its own process.

    Args:
        model: checkpoint directory, hub id, or ``forge_env.models.TINY_MODEL_ID``.
        backend: ``"hf"`` or ``"vllm"``.
        config: keyword arguments of ``HFGeneratorConfig`` / ``VLLMGeneratorConfig``.
        device: ``"cpu"`` or ``"cuda"``; default ``"cuda"`` when a GPU is visible, else ``"cpu"``.
        seed: seed of the tiny model's initial weights (vLLM gets them as a checkpoint it writes first).
        weight_source: picklable weight source used by ``update_weights`` (``forge_env.weights.WeightSource``;
            a ``WeightStore`` itself lets vLLM replicas map its files).
    """

    def __init__(
        self,
        model: str,
        backend: str = "hf",
        config: Mapping[str, Any] | None = None,
        device: str | None = None,
        seed: int = 0,
        weight_source: WeightSource | None = None,
    ) -> None:
        if backend not in ("hf", "vllm"):
            raise ValueError(f"backend must be 'hf' or 'vllm', got {backend!r}")
        self.model = model
        self.backend = backend
        self.config = dict(config or {})
        self.device = device
        self.seed = seed
        self.weight_source = weight_source
        self.generator: Any = None
        self._tiny_dir: str | None = None

    @endpoint
    async def setup(self) -> None:
        """Load the model (in the replica's process)."""
        if self.backend == "vllm":
            self.generator = await asyncio.to_thread(self._start_vllm)
            return
        import torch

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.generator = make_generator("hf", model=self.model, config=self.config, device=device, seed=self.seed,
                                        weight_source=self.weight_source)

    def _start_vllm(self) -> Any:
        from forge_env.models import TINY_MODEL_ID, save_tiny_model

        model = self.model
        if model == TINY_MODEL_ID:  # vLLM loads checkpoints from disk: write the tiny model's first
            self._tiny_dir = tempfile.mkdtemp(prefix="forge-tiny-")
            model = str(save_tiny_model(self._tiny_dir, seed=self.seed))
        return make_generator("vllm", model=model, config=self.config, device=self.device,
                              weight_source=self.weight_source)

    @concurrent_endpoint
    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> Completion:
        return await self.generator.generate(prompt_ids, sampling, session_id=session_id)

    @concurrent_endpoint
    async def update_weights(self, version: int) -> int:
        await self.generator.update_weights(version)
        return self.generator.policy_version

    @concurrent_endpoint
    async def load_state_dict(self, state_dict: Any, version: int) -> int:
        await self.generator.load_state_dict(state_dict, version)
        return self.generator.policy_version

    @concurrent_endpoint
    async def release_session(self, session_id: str) -> None:
        await self.generator.release_session(session_id)

    @concurrent_endpoint
    async def policy_version(self) -> int:
        return self.generator.policy_version

    @concurrent_endpoint
    async def stats(self) -> dict[str, Any]:
        stats = self.generator.stats
        return dict(stats() if callable(stats) else stats)

    async def __cleanup__(self, exc: BaseException | None) -> None:
        if self.generator is not None:
            self.generator.close()
        if self._tiny_dir is not None:
            shutil.rmtree(self._tiny_dir, ignore_errors=True)


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


class GeneratorService(GeneratorBase):
    """A ``Generator`` backed by replicas of ``GeneratorActor`` (sticky sessions pin a replica)."""

    def __init__(self, service: Service, policy_version: int = 0) -> None:
        self.service = service
        self._version = policy_version

    @classmethod
    async def launch(
        cls,
        model: str,
        *,
        backend: str = "hf",
        num_replicas: int = 1,
        config: Mapping[str, Any] | None = None,
        device: str | None = None,
        seed: int = 0,
        weight_source: WeightSource | None = None,
        **options: Any,
    ) -> GeneratorService:
        """Start ``num_replicas`` generator replicas; extra keywords are service options (``backend=`` is
        the generator backend, so pass the service's as ``service_backend="local"``)."""
        service_backend = options.pop("service_backend", "monarch")
        options.setdefault("with_gpus", (device or "").startswith("cuda") or (backend == "vllm" and _cuda_visible()))
        options.setdefault("mesh_name", "GeneratorActor")
        configured = GeneratorActor.options(
            num_replicas=num_replicas,
            backend=service_backend,
            session_end_endpoint="release_session",
            **options,
        )
        service = await configured.as_service(model, backend, dict(config or {}), device, seed, weight_source)
        return cls(service)

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> Completion:
        """Route to any replica, or with ``session_id`` to the replica that holds that session."""
        return await self.service.endpoint("generate").route(
            list(prompt_ids), sampling, session_id=session_id
        )

    async def update_weights(self, version: int) -> None:
        """Every replica loads ``version`` from its weight source."""
        self._settle(await self.service.endpoint("update_weights").fanout(version), version)

    async def load_state_dict(self, state_dict: Any, version: int) -> None:
        """Send ``state_dict`` to every replica (fine for small models; big ones use a weight source)."""
        self._settle(await self.service.endpoint("load_state_dict").fanout(state_dict, version), version)

    def _settle(self, results: list[Any], version: int) -> None:
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise WeightUpdateError(
                f"{len(failed)} of {len(results)} replicas did not load version {version}: {failed[0]}"
            ) from failed[0]
        self._version = version

    async def release_session(self, session_id: str) -> None:
        """End the session on the service; its replica drops the KV cache."""
        try:
            await self.service.release_session(session_id)
        except ServiceError:  # the replica is gone, and its cache with it
            pass

    async def stats(self) -> list[dict[str, Any]]:
        """Each replica's generator counters (a replica that is down gives its error)."""
        return await self.service.endpoint("stats").fanout()

    async def shutdown(self) -> None:
        await self.service.shutdown()

    async def __aenter__(self) -> GeneratorService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
