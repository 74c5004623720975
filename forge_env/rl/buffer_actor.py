"""ReplayBufferActor: the replay buffer as a Monarch actor, shared by rollout loops and the trainer.

    buffer = await ReplayBufferActor.options(procs=1).as_actor(batch_size=16, max_policy_age=1)
    await buffer.add.call_one(samples)
    batch = await buffer.sample.call_one(curr_policy_version=step)   # None until a batch can be filled

Every endpoint delegates to one in-process ``ReplayBuffer`` (same rules, same state dict),
so an actor's state can be checkpointed and restored into a local buffer and back.
"""

from __future__ import annotations

from typing import Any

from forge_env.rl.buffer import ReplayBuffer, ReplayBufferConfig
from forge_env.rl.types import TrainSample
from forge_env.services import ForgeActor, endpoint


class ReplayBufferActor(ForgeActor):
    """A ``ReplayBuffer`` behind Monarch endpoints (arguments as for ``ReplayBuffer``)."""

    def __init__(self, config: ReplayBufferConfig | None = None, **overrides: Any) -> None:
        self.buffer = ReplayBuffer(config, **overrides)

    @endpoint
    async def add(self, samples: list[TrainSample]) -> int:
        """Add samples; returns the buffer size."""
        return self.buffer.add(samples)

    @endpoint
    async def sample(
        self, curr_policy_version: int, batch_size: int | None = None
    ) -> list[TrainSample] | list[list[TrainSample]] | None:
        """A batch (or dp shards) at ``curr_policy_version``, or None if one cannot be filled yet."""
        return self.buffer.sample(curr_policy_version, batch_size)

    @endpoint
    async def evict(self, curr_policy_version: int) -> int:
        return self.buffer.evict(curr_policy_version)

    @endpoint
    async def num_samples(self) -> int:
        """How many samples the buffer holds (``size`` would collide with Monarch's ActorMesh.size)."""
        return len(self.buffer)

    @endpoint
    async def metrics(self, curr_policy_version: int | None = None) -> dict[str, float]:
        return self.buffer.metrics(curr_policy_version)

    @endpoint
    async def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    @endpoint
    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)

    @endpoint
    async def clear(self) -> None:
        self.buffer.clear()
