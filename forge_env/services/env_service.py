"""Environments as CPU-only services, and ``RemoteEnv``: a client with TextEnv's async API.

    envs = await EnvService.launch("forge_env/Math-v0", num_replicas=4, max_episodes_per_replica=64)
    env = envs.env()                                   # a RemoteEnv: one episode at a time
    observation, info = await env.areset(seed=0)
    observation, reward, terminated, truncated, info = await env.astep(action)
    await env.aclose()
    await envs.shutdown()

Each ``RemoteEnv`` is a sticky session of the service: its episode lives on one replica,
which holds many episodes side by side. An environment's answer to a bad action is an
ordinary observation; only a dead replica is a failure. Then an episode of an environment that
``supports_snapshots`` is *resumed*: the client holds the snapshot of its last completed turn, restores it
on a healthy replica and takes the turn there, so the caller gets the step an uninterrupted episode would
have given, with ``info["resumed"]`` saying so (and ``EnvService.metrics().sessions_resumed`` counting it).
An episode that cannot be resumed raises ``SessionLostError`` (the episode is gone; ``areset`` starts a new
one elsewhere). The reset rule is
:class:`~forge_env.core.remote.RemoteSessions`', shared with the OpenEnv client
(``forge_env.openenv.client_env``), which reaches its server over a WebSocket instead of a Monarch service
(``forge_env.core.remote`` says why the transports differ).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import forge_env
from forge_env.core.env import EnvError, ResetNeededError
from forge_env.core.remote import RemoteSessions
from forge_env.core.snapshots import merge_snapshot
from forge_env.services.endpoints import accepts_parameter, endpoint_names
from forge_env.services.env_server import EnvCapacityError, EnvServer
from forge_env.services.errors import ServiceError, SessionLimitError, SessionLostError
from forge_env.services.metrics import ServiceMetrics
from forge_env.services.service import Service
from forge_env.types import Message


class EnvService:
    """Replicas of :class:`EnvServer` for one environment id, and a factory of :class:`RemoteEnv` clients."""

    def __init__(self, service: Service, env_id: str, max_episodes_per_replica: int, *,
                 resume_sessions: bool = True) -> None:
        self.service = service
        self.env_id = env_id
        self.max_episodes_per_replica = max_episodes_per_replica
        server = service.actor_class
        #: Episodes of environments that snapshot are resumed on a healthy replica when theirs dies (the
        #: replica class must take ``snapshots``/``snapshot_from`` and have ``restore``, as EnvServer does).
        self.resume_sessions = resume_sessions and "restore" in endpoint_names(server) and accepts_parameter(
            server, "reset", "snapshots") and accepts_parameter(server, "step", "snapshot_from")
        self.sessions_resumed = 0

    @classmethod
    async def launch(cls, env_id: str, *, num_replicas: int = 1, max_episodes_per_replica: int = 64,
                     episode_idle_ttl_s: float | None = 600.0, env_kwargs: dict[str, Any] | None = None,
                     server: type[EnvServer] = EnvServer, resume_sessions: bool = True, **options: Any) -> EnvService:
        """Start ``num_replicas`` CPU-only replicas serving ``forge_env.make(env_id, **env_kwargs)``.

        Extra keyword arguments are service options (``backend="local"``, ``load_balancing``, ...);
        ``server`` is the replica's actor class (an ``EnvServer`` subclass, e.g. one that traces its steps).
        ``resume_sessions=False``: never resume an episode whose replica died (no snapshot travels with a step).
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
        return cls(service, env_id, max_episodes_per_replica, resume_sessions=resume_sessions)

    def env(self) -> RemoteEnv:
        """A new client environment (it takes a slot of the service at its first ``areset``)."""
        return RemoteEnv(self)

    @property
    def capacity(self) -> int:
        """Episodes the service may hold open at once."""
        return len(self.service.replicas) * self.max_episodes_per_replica

    def metrics(self) -> ServiceMetrics:
        """The service's metrics, with ``sessions_resumed``: episodes resumed on another replica (each also
        counts in ``sessions_lost``, as the session it left)."""
        return dataclasses.replace(self.service.metrics(), sessions_resumed=self.sessions_resumed)

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

    #: Resumes tried for one step before its ``SessionLostError`` is raised (each on a healthy replica).
    max_resumes_per_step = 2

    def __init__(self, service: EnvService) -> None:
        self.env_service = service
        self.spec_id = service.env_id
        self.episode_id = uuid.uuid4().hex
        self._started = False
        self._closed = False
        self._snapshot: dict[str, Any] | None = None  # the episode after its last completed turn, if it snapshots

    @property
    def replica(self) -> int | None:
        """Index of the replica holding this episode (``None`` before ``areset`` or after a loss)."""
        return self.env_service.service.session_replica(self.episode_id)

    @property
    def held_snapshot(self) -> dict[str, Any] | None:
        """The snapshot of the episode after its last completed turn that this client holds, to resume it on
        another replica (``None``: the episode cannot be resumed, or has ended). Plain JSON, updated in place by each
        step: copy it to keep it; do not modify it."""
        return self._snapshot

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
        self._snapshot = None
        try:
            if not service.resume_sessions:
                return await service.service.reset.route(seed=seed, options=options, session_id=self.episode_id)
            observation, info, self._snapshot = await service.service.reset.route(
                seed=seed, options=options, snapshots=True, session_id=self.episode_id)
            return observation, info
        except SessionLimitError as error:
            if isinstance(error, EnvCapacityError):
                raise
            raise EnvCapacityError(
                f"{service.env_id}: the EnvService is full ({service.capacity} open episodes = "
                f"{len(service.service.replicas)} replicas x max_episodes_per_replica="
                f"{service.max_episodes_per_replica}); close finished environments (await env.aclose()) "
                "or launch with more replicas / max_episodes_per_replica") from error

    async def astep(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Take the assistant's turn. If the replica holding the episode died, an episode that snapshots is
        resumed on a healthy replica from its last completed turn and the turn taken there (``info["resumed"]``
        says so); otherwise ``SessionLostError``."""
        self._check_open()
        if not self._started:
            raise ResetNeededError("call areset() before astep()")
        service = self.env_service.service
        if self._snapshot is None:
            return await service.call_in_session(self.episode_id, "step", (), {"action": action})
        resumed: dict[str, Any] | None = None
        for attempt in range(self.max_resumes_per_step + 1):
            try:
                if resumed is not None:
                    await self._restore_elsewhere()
                step = {"action": action, "snapshot_from": len(self._snapshot["state"]["messages"])}
                result, delta = await service.call_in_session(self.episode_id, "step", (), step)
                break
            except SessionLostError as error:
                if attempt == self.max_resumes_per_step or self._snapshot is None:
                    self._snapshot = None  # the episode is lost after all
                    raise
                if resumed is None:
                    resumed = {"from_turn": self._snapshot["state"]["turn"], "reason": str(error)}
                resumed["attempts"] = attempt + 1
            except ServiceError:
                raise  # the service's own trouble (overloaded, shut down): the episode is where it was
            except BaseException:  # the step itself failed (an InfraError ended the episode), or was cancelled:
                self._snapshot = None  # the replica's episode may be ahead of the snapshot; never revive it
                raise
        self._snapshot = None if delta is None else merge_snapshot(self._snapshot, delta)
        if resumed is not None:
            self.env_service.sessions_resumed += 1
            resumed["replica"] = self.replica
            result[-1]["resumed"] = resumed
        return result

    async def _restore_elsewhere(self) -> None:
        """A new session, on a healthy replica, continuing the held snapshot."""
        assert self._snapshot is not None
        await self._renew_session()
        try:
            await self.env_service.service.call_in_session(self.episode_id, "restore", (),
                                                           {"snapshot": self._snapshot})
        except SessionLostError:
            raise  # this replica died too: another try, if any are left
        except Exception as error:  # the replica refused the snapshot: no point in trying again
            self._snapshot = None
            await self.env_service.service.release_session(self.episode_id)
            raise SessionLostError(f"{self.spec_id}: the episode could not be resumed on another replica "
                                   f"({type(error).__name__}: {error})", session_id=self.episode_id) from error

    async def aclose(self) -> None:
        """Close the episode and free its slot in the service."""
        if self._closed:
            return
        self._closed = True
        self._snapshot = None
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
