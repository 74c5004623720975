"""Actors used by the RL-core tests. Module level, so Monarch processes can import them."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from forge_env.rl.weight_store import WeightStore


class WeightReader(Actor):
    """Reads a version from a WeightStore in its own process and reports per-tensor checksums."""

    @endpoint
    async def checksum(self, store: WeightStore, version: int | None) -> tuple[int, dict[str, float]]:
        state, got = store.get(version)
        return got, {k: float(t.double().sum()) for k, t in state.items()}
