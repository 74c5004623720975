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

Modules: ``actor`` (``ForgeActor``: ``options`` / ``as_service`` / ``as_actor``), ``options``
(``ServiceOptions``), ``service`` (``Service``: spawning, health, sessions), ``verbs`` (``route`` /
``fanout`` / ``session()``), ``routing`` (the routers ``load_balancing`` names), ``sessions`` (the
session table), ``replica`` (one replica: health, queue, one call), ``spawning`` (starting a replica
where its placement says), ``placement`` (host groups of a Monarch job, GPUs of a host),
``local_backend`` / ``monarch_backend`` (in-process / real process meshes), ``endpoints``,
``metrics``, ``errors``, and ``env_server`` / ``env_service`` (environments as a service).
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
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import reserve_gpus
from forge_env.services.routing import (
    FewestSessionsRouter,
    LeastLoadedRouter,
    RoundRobinRouter,
    Router,
    SessionRouter,
)
from forge_env.services.service import Service
from forge_env.services.verbs import ServiceEndpoint, ServiceSession

__all__ = [
    "EnvCapacityError", "EnvServer", "EnvService", "EpisodeNotFoundError", "FewestSessionsRouter", "ForgeActor",
    "LeastLoadedRouter", "NoHealthyReplicaError", "RemoteEnv", "ReplicaFailedError", "ReplicaMetrics",
    "ReplicaSpawnError", "RoundRobinRouter", "Router", "Service", "ServiceClosedError", "ServiceEndpoint",
    "ServiceError", "ServiceMetrics", "ServiceOptions", "ServiceOverloadedError", "ServiceSession",
    "SessionLimitError", "SessionLostError", "SessionRouter", "concurrent_endpoint", "endpoint", "reserve_gpus",
]
