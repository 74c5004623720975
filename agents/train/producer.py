"""How the async GRPO loop gets its rollouts: a :class:`Producer` strategy over a :class:`LoopHost`.

The loop (:class:`agents.train.loop.GRPOLoop`) runs one producer in a task next to training: the round-based
one (:class:`RoundProducer`, here) or, with ``loop.partial_rollouts``, the streaming one
(:class:`agents.train.partial.PartialRollouts`). A producer sees the loop only through :class:`LoopHost`:
its configuration and state, the components, and three calls to report what it did. Neither side reaches
into the other's private members, and neither module imports the other's (the loop imports the producers).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from agents.rollout import EpisodeBudget
from agents.train.checkpoint import LoopState
from agents.train.components import Components
from agents.train.config import GRPOConfig
from agents.train.sampling import RoundSampler
from forge_env.generation.base import SamplingParams


class LoopHost(Protocol):
    """What a producer may use of its loop (``GRPOLoop`` fits)."""

    config: GRPOConfig
    c: Components
    state: LoopState
    budget: EpisodeBudget
    reference: Any
    round_sampler: RoundSampler

    def round_sampling(self, round_index: int) -> SamplingParams:
        """The sampling parameters of round ``round_index`` (its base seed derived from ``loop.seed``)."""
        ...

    def samples_added(self) -> None:
        """New samples are in the buffer: wake the trainer if it waits for a batch."""
        ...

    def round_finished(self, metrics: dict[str, float], seconds: float) -> bool:
        """A round (``groups_per_step`` groups) is done, with its metrics and rollout time; True when RL must stop."""
        ...


class Producer(Protocol):
    """A rollout strategy of the async loop: plays episodes into the buffer until ``stop`` is set or the host
    says RL must stop (``round_finished`` returned True)."""

    async def produce(self, stop: asyncio.Event) -> None: ...


class RoundHost(LoopHost, Protocol):
    """What the round-based producer uses of its loop besides :class:`LoopHost`."""

    async def collect_round(self) -> dict[str, float]:
        """Play one round at the current policy into the buffer (recording it); return its metrics."""
        ...

    def after_round(self) -> bool:
        """Count the round just played; True when RL must stop."""
        ...


class RoundProducer:
    """The async loop's round-based :class:`Producer`: plays rounds while the buffer holds fewer than
    ``loop.max_rollouts_ahead`` batches."""

    def __init__(self, loop: RoundHost) -> None:
        self.loop = loop

    async def produce(self, stop: asyncio.Event) -> None:
        loop, cfg = self.loop, self.loop.config
        ahead = cfg.loop.max_rollouts_ahead * cfg.buffer.batch_size * cfg.buffer.dp_size
        while not stop.is_set():
            while len(loop.c.buffer) >= ahead and not stop.is_set():
                await asyncio.sleep(0.01)
            await loop.collect_round()
            if loop.after_round():
                return
