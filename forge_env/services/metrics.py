"""Service metrics: counters, queue depth and latency percentiles, as plain dataclasses."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


class LatencyWindow:
    """The most recent ``size`` call latencies (seconds), for percentiles."""

    def __init__(self, size: int = 10_000) -> None:
        self.samples: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)

    def percentiles_ms(self, *qs: float) -> list[float | None]:
        if not self.samples:
            return [None for _ in qs]
        values = np.percentile(np.fromiter(self.samples, dtype=float), qs) * 1000.0
        return [float(v) for v in values]


@dataclass
class ReplicaMetrics:
    """One replica right now."""

    index: int
    state: str
    generation: int
    pids: list[int]
    in_flight: int
    queue_depth: int
    sessions: int
    requests: int
    errors: int
    failures: int
    respawns: int
    last_failure: str = ""
    host: str = ""


@dataclass
class ServiceMetrics:
    """A service right now. ``errors`` counts application errors; ``failures`` counts replica deaths.

    Latencies are of completed calls (queue wait included), over the last 10,000 calls.
    """

    name: str
    requests: int
    errors: int
    failures: int
    retries: int
    respawns: int
    healthy_replicas: int
    in_flight: int
    queue_depth: int
    sessions: int
    sessions_lost: int
    latency_p50_ms: float | None
    latency_p90_ms: float | None
    latency_p99_ms: float | None
    replicas: list[ReplicaMetrics] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
