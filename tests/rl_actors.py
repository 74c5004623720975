"""Actors used by the RL-core tests. Module level, so Monarch processes can import them."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from forge_env.generation import Completion
from forge_env.services import ForgeActor
from forge_env.weights import WeightStore


class WeightReader(Actor):
    """Reads a version from a WeightStore in its own process and reports per-tensor checksums."""

    @endpoint
    async def checksum(self, store: WeightStore, version: int | None) -> tuple[int, dict[str, float]]:
        state, got = store.get(version)
        return got, {k: float(t.double().sum()) for k, t in state.items()}


class TinyPolicyGenerator(ForgeActor):
    """An HFGenerator over the small tiny model, in its own process, taking weights from a WeightStore."""

    def __init__(self, store: WeightStore, seed: int = 0) -> None:
        self.store = store
        self.seed = seed
        self.generator = None

    @endpoint
    async def setup(self) -> None:
        from forge_env.generation import HFGenerator
        from forge_env.models import build_byte_tokenizer
        from tests.rl_support import tiny_model

        self.generator = HFGenerator(tiny_model(self.seed), build_byte_tokenizer(), weight_source=self.store)

    @endpoint
    async def update_weights(self, version: int) -> int:
        await self.generator.update_weights(version)
        return self.generator.policy_version

    @endpoint
    async def policy_version(self) -> int:
        return self.generator.policy_version

    @endpoint
    async def weight_transport(self) -> str | None:
        """How this process's last relayed version came (``RemoteWeightSource.last_transport``)."""
        return getattr(self.store, "last_transport", None)

    @endpoint
    async def generate(self, prompt_ids: list[int], max_tokens: int) -> Completion:
        from forge_env.generation import SamplingParams

        return await self.generator.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
