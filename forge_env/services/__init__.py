"""Actors and services on Monarch: replicas, route / fanout / session, health, respawn, metrics.

    from monarch.actor import endpoint
    from forge_env.services import ForgeActor

    class Scorer(ForgeActor):
        @endpoint
        async def score(self, text: str) -> float: ...

    svc = await Scorer.options(num_replicas=4).as_service()
    await svc.score.route("hello")            # one healthy replica, load balanced
    await svc.score.fanout("hello")           # every replica, in replica order
    async with svc.session():                 # every call inside lands on one replica
        await svc.score.route("again")
    await svc.shutdown()

``EnvService`` / ``RemoteEnv`` serve registered environments this way (see
:mod:`forge_env.services.env_service`). Importing this package imports Monarch; it is
not imported by ``import forge_env``.
"""

from monarch.actor import concurrent_endpoint, endpoint

from forge_env.services.actor import ForgeActor
from forge_env.services.env_server import EnvCapacityError, EnvServer, EpisodeNotFoundError
from forge_env.services.env_service import EnvService, RemoteEnv
from forge_env.services.errors import (
    NoHealthyReplicaError,
    ReplicaFailedError,
    ReplicaSpawnError,
    ServiceClosedError,
    ServiceError,
    ServiceOverloadedError,
    SessionLimitError,
    SessionLostError,
)
from forge_env.services.metrics import ReplicaMetrics, ServiceMetrics
from forge_env.services.monarch_backend import reserve_gpus
from forge_env.services.options import ServiceOptions
from forge_env.services.service import Service
from forge_env.services.verbs import ServiceEndpoint, ServiceSession

__all__ = [
    "EnvCapacityError", "EnvServer", "EnvService", "EpisodeNotFoundError", "ForgeActor", "RemoteEnv", "NoHealthyReplicaError", "ReplicaFailedError", "ReplicaMetrics", "ReplicaSpawnError", "Service",
    "ServiceClosedError", "ServiceEndpoint", "ServiceError", "ServiceMetrics", "ServiceOptions",
    "ServiceOverloadedError", "ServiceSession", "SessionLimitError", "SessionLostError", "concurrent_endpoint",
    "endpoint", "reserve_gpus",
]
