"""Environments as CPU-only services, and ``RemoteEnv``: a client with TextEnv's async API.

    envs = await EnvService.launch("forge_env/Math-v0", num_replicas=4, max_episodes_per_replica=64)
    env = envs.env()                                   # a RemoteEnv: one episode at a time
    observation, info = await env.areset(seed=0)
    observation, reward, terminated, truncated, info = await env.astep(action)
    await env.aclose()
    await envs.shutdown()

Each ``RemoteEnv`` is a sticky session of the service: its episode lives on one replica,
which holds many episodes side by side. An environment's answer to a bad action is an
ordinary observation; only a dead replica is a failure, and then ``astep`` raises
``SessionLostError`` (the episode is gone; ``areset`` starts a new one elsewhere). That rule is
:class:`~forge_env.core.remote.RemoteSessions`', shared with the OpenEnv client
(``forge_env.openenv.client_env``), which reaches its server over a WebSocket instead of a Monarch service
(``forge_env.core.remote`` says why the transports differ).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import forge_env
from forge_env.core.env import EnvError, ResetNeededError
from forge_env.core.remote import RemoteSessions
from forge_env.services.env_server import EnvCapacityError, EnvServer
from forge_env.services.errors import SessionLimitError, SessionLostError
from forge_env.services.metrics import ServiceMetrics
from forge_env.services.service import Service
from forge_env.types import Message


class EnvService:
    """Replicas of :class:`EnvServer` for one environment id, and a factory of :class:`RemoteEnv` clients."""

    def __init__(self, service: Service, env_id: str, max_episodes_per_replica: int) -> None:
        self.service = service
        self.env_id = env_id
        self.max_episodes_per_replica = max_episodes_per_replica

    @classmethod
    async def launch(cls, env_id: str, *, num_replicas: int = 1, max_episodes_per_replica: int = 64,
                     episode_idle_ttl_s: float | None = 600.0, env_kwargs: dict[str, Any] | None = None,
                     server: type[EnvServer] = EnvServer, **options: Any) -> EnvService:
        """Start ``num_replicas`` CPU-only replicas serving ``forge_env.make(env_id, **env_kwargs)``.

        Extra keyword arguments are service options (``backend="local"``, ``load_balancing``, ...);
        ``server`` is the replica's actor class (an ``EnvServer`` subclass, e.g. one that traces its steps).
        """
        spec = forge_env.spec(env_id)  # an unknown id fails here, with suggestions
        if max_episodes_per_replica < 1:
            raise ValueError(f"max_episodes_per_replica must be at least 1, got {max_episodes_per_replica}")
        options.setdefault("max_concurrent_per_replica", max_episodes_per_replica)
        options.setdefault("direct_calls", True)  # steps of replicas on this machine skip Monarch's per-call cost
        options.setdefault("mesh_name", "EnvServer_" + env_id)
        if not (isinstance(server, type) and issubclass(server, EnvServer)):
            raise TypeError(f"server must be EnvServer or a subclass of it, got {server!r}")
        configured = server.options(
            num_replicas=num_replicas, with_gpus=False, max_sessions=num_replicas * max_episodes_per_replica,
            session_ttl_s=episode_idle_ttl_s, session_end_endpoint="close_episode", **options)
        service = await configured.as_service(env_id, env_kwargs, spec, max_episodes_per_replica, episode_idle_ttl_s)
        return cls(service, env_id, max_episodes_per_replica)

    def env(self) -> RemoteEnv:
        """A new client environment (it takes a slot of the service at its first ``areset``)."""
        return RemoteEnv(self)

    @property
    def capacity(self) -> int:
        """Episodes the service may hold open at once."""
        return len(self.service.replicas) * self.max_episodes_per_replica

    def metrics(self) -> ServiceMetrics:
        return self.service.metrics()

    async def replica_stats(self) -> list[Any]:
        """Each replica's open episodes and counters (a ``ServiceError`` in the slot of a dead one)."""
        return await self.service.stats.fanout()

    async def shutdown(self) -> None:
        await self.service.shutdown()

    async def __aenter__(self) -> EnvService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()


class RemoteEnv(RemoteSessions):
    """An environment served by an :class:`EnvService`, with TextEnv's async API and return values
    (an :class:`~forge_env.core.remote.AsyncEnv`)."""

    def __init__(self, service: EnvService) -> None:
        self.env_service = service
        self.spec_id = service.env_id
        self.episode_id = uuid.uuid4().hex
        self._started = False
        self._closed = False

    @property
    def replica(self) -> int | None:
        """Index of the replica holding this episode (``None`` before ``areset`` or after a loss)."""
        return self.env_service.service.session_replica(self.episode_id)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                     ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode (on the same replica as this client's last one, if it is still alive)."""
        self._check_open()
        result = await self._reset_remote(lambda: self._reset(seed, options))
        self._started = True
        return result

    def _session_lost(self, error: BaseException) -> bool:
        return isinstance(error, SessionLostError)

    async def _renew_session(self) -> None:
        self.episode_id = uuid.uuid4().hex  # the old replica is gone: the next reset is routed afresh

    async def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list[Message], dict[str, Any]]:
        service = self.env_service
        try:
            return await service.service.reset.route(seed=seed, options=options, session_id=self.episode_id)
        except SessionLimitError as error:
            if isinstance(error, EnvCapacityError):
                raise
            raise EnvCapacityError(
                f"{service.env_id}: the EnvService is full ({service.capacity} open episodes = "
                f"{len(service.service.replicas)} replicas x max_episodes_per_replica="
                f"{service.max_episodes_per_replica}); close finished environments (await env.aclose()) "
                "or launch with more replicas / max_episodes_per_replica") from error

    async def astep(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Take the assistant's turn; ``SessionLostError`` if the replica holding the episode died."""
        self._check_open()
        if not self._started:
            raise ResetNeededError("call areset() before astep()")
        return await self.env_service.service.call_in_session(self.episode_id, "step", (), {"action": action})

    async def aclose(self) -> None:
        """Close the episode and free its slot in the service."""
        if self._closed:
            return
        self._closed = True
        await self.env_service.service.release_session(self.episode_id)

    def close(self) -> None:
        """Like ``aclose`` without awaiting it (the release runs on the running event loop)."""
        if self._closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise EnvError("RemoteEnv.close() needs the event loop its service runs on; use await env.aclose()"
                           ) from None
        self.env_service.service.run_in_background(self.aclose())

    def _check_open(self) -> None:
        if self._closed:
            raise EnvError("this RemoteEnv was closed; get a new one with env_service.env()")

    async def __aenter__(self) -> RemoteEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<RemoteEnv {self.spec_id} episode={self.episode_id[:8]} replica={self.replica}>"
