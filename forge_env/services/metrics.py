"""Service metrics: counters, queue depth and latency percentiles, as plain dataclasses."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from forge_env.services.replica import Replica


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

    Latencies are of completed calls (queue wait included), over the last 10,000 calls. ``sessions_lost`` counts
    sessions whose replica died or that expired; ``sessions_resumed`` those of them continued on another replica.
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
    sessions_resumed: int = 0  # sessions continued on another replica (an EnvService's resumed episodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def service_metrics(name: str, replicas: Sequence[Replica], host_labels: Sequence[str], *, retries: int,
                    latency: LatencyWindow, sessions: int, sessions_lost: int) -> ServiceMetrics:
    """A service's metrics right now: its replicas' counters (which survive respawns) summed, plus its own
    ``retries``, call ``latency`` and session counts (``host_labels``: each replica's host, in replica order)."""
    p50, p90, p99 = latency.percentiles_ms(50, 90, 99)
    per_replica = [ReplicaMetrics(
        index=r.index, state=r.state, generation=r.generation, host=host,
        pids=list(r.handle.pids) if r.handle is not None else [], in_flight=r.slots.in_use,
        queue_depth=r.slots.queued, sessions=r.sessions, requests=r.stats.requests, errors=r.stats.errors,
        failures=r.stats.failures, respawns=r.stats.respawns, last_failure=r.last_failure,
    ) for r, host in zip(replicas, host_labels, strict=True)]
    return ServiceMetrics(
        name=name, requests=sum(r.requests for r in per_replica), errors=sum(r.errors for r in per_replica),
        failures=sum(r.failures for r in per_replica), retries=retries, respawns=sum(r.respawns for r in per_replica),
        healthy_replicas=sum(r.healthy for r in replicas), in_flight=sum(r.in_flight for r in per_replica),
        queue_depth=sum(r.queue_depth for r in per_replica), sessions=sessions, sessions_lost=sessions_lost,
        latency_p50_ms=p50, latency_p90_ms=p90, latency_p99_ms=p99, replicas=per_replica,
    )
