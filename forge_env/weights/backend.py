"""What every weight-store backend shares: the ``WeightBackend`` protocol and what ``put``/``get`` return."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class WeightsInfo:
    """What a ``put`` stored."""

    version: int
    num_tensors: int
    num_bytes: int


class StoredWeights(dict):
    """A stored version's tensors as copy-on-write views of shared memory that nothing else writes.

    A generator may adopt them as its parameters instead of copying them (``immutable_views``):
    the hand-off then costs the trainer's one write, and the generator's pull is only a mapping.
    """

    immutable_views = True


class WeightBackend(Protocol):
    """Where the bytes live; ``WeightStore`` adds versioning on top."""

    def put(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightsInfo: ...
    def get(self, version: int) -> dict[str, torch.Tensor]: ...
    def versions(self) -> list[int]: ...
    def delete(self, version: int) -> None: ...
    def clear(self) -> None: ...
