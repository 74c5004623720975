"""EnvServer: the actor behind an EnvService replica, holding many episodes of one environment.

Each episode is its own ``TextEnv`` instance keyed by the session id of the client's
``RemoteEnv``. Endpoints are concurrent, so a slow tool call in one episode does not
hold up the others. Episodes idle longer than the TTL are closed by a reaper (the
service also ends sessions it expires; this catches episodes whose client vanished).

Durable sessions: asked to (``snapshots=True`` at reset, ``snapshot_from=n`` at a step), a replica sends the
episode's snapshot back with each reply (after a step, only what changed: the messages after the first ``n``),
and ``restore`` continues an episode from a snapshot on another replica (docs/services.md "Durable sessions").
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from monarch.actor import concurrent_endpoint, endpoint

import forge_env
from forge_env.core.env import EnvError, TextEnv
from forge_env.core.registry import EnvSpec
from forge_env.core.snapshots import SnapshotError
from forge_env.services.actor import ForgeActor
from forge_env.services.errors import SessionLimitError

logger = logging.getLogger(__name__)

SPARE_ENVS = 16  # closed environments kept for reuse, so a new episode rarely pays for construction


class EnvCapacityError(SessionLimitError):
    """The environment service holds as many open episodes as it may; close finished ones or add capacity."""


class EpisodeNotFoundError(EnvError):
    """No open episode under this id on the replica (closed, or reaped after being idle); call ``areset``."""


@dataclass
class _Episode:
    env: TextEnv
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0


class EnvServer(ForgeActor):
    """Serves episodes of ``env_id`` (built with ``forge_env.make(env_id, **env_kwargs)``).

    Args:
        env_id: a registered environment id.
        env_kwargs: keyword arguments for ``forge_env.make``.
        spec: the client's registration of ``env_id``, registered here if this process lacks it
            (ids registered at run time in the client are unknown to a fresh replica process).
        max_episodes: open episodes this replica may hold.
        episode_idle_ttl_s: an episode idle this long is closed (``None``: never).
    """

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None, spec: EnvSpec | None = None,
                 max_episodes: int = 64, episode_idle_ttl_s: float | None = 600.0) -> None:
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.spec = spec
        self.max_episodes = max_episodes
        self.ttl_s = episode_idle_ttl_s
        self.episodes: dict[str, _Episode] = {}
        self.spare: list[TextEnv] = []
        self.counters = {"episodes_started": 0, "episodes_reaped": 0, "episodes_restored": 0, "steps": 0}
        self._reaper: asyncio.Task[None] | None = None

    @endpoint
    async def setup(self) -> None:
        """Register the environment if needed and build one instance, so a bad id or kwargs fail the spawn."""
        if self.spec is not None and self.env_id not in forge_env.specs():
            forge_env.register(self.spec.id, self.spec.entry_point, description=self.spec.description,
                               **self.spec.kwargs)
        self.spare.append(self._make_env())

    def _make_env(self) -> TextEnv:
        return forge_env.make(self.env_id, **self.env_kwargs)

    def _open(self, session_id: str) -> _Episode:
        episode = self.episodes.get(session_id)
        if episode is None:
            if len(self.episodes) >= self.max_episodes:
                raise EnvCapacityError(
                    f"replica (pid {os.getpid()}) of {self.env_id} holds {len(self.episodes)} open episodes "
                    f"(max_episodes_per_replica={self.max_episodes}); close finished environments")
            episode = self.episodes[session_id] = _Episode(self.spare.pop() if self.spare else self._make_env())
        self._start_reaper()
        return episode

    @concurrent_endpoint
    async def reset(self, session_id: str, seed: int | None = None, options: dict[str, Any] | None = None,
                    snapshots: bool = False) -> tuple:
        """Start (or restart) the episode ``session_id``; returns ``(observation, info)``, and with ``snapshots``
        ``(observation, info, snapshot)`` (``None`` when the environment cannot snapshot)."""
        episode = self._open(session_id)
        self.counters["episodes_started"] += 1
        episode.busy += 1
        try:
            observation, info = await episode.env.areset(seed=seed, options=options)
            if not snapshots:
                return observation, info
            return observation, info, self._snapshot(episode.env, 0)
        finally:
            episode.busy -= 1
            episode.last_used = time.monotonic()

    @concurrent_endpoint
    async def step(self, session_id: str, action: Any, snapshot_from: int | None = None) -> tuple:
        """One assistant turn in episode ``session_id``; returns the gymnasium 5-tuple, and with ``snapshot_from=n``
        ``(5-tuple, snapshot delta)``: the episode after this turn, less its first ``n`` messages (``None`` once
        the episode has ended or when it cannot snapshot)."""
        episode = self.episodes.get(session_id)
        if episode is None:
            raise EpisodeNotFoundError(f"no open episode {session_id!r} of {self.env_id} on this replica (closed, "
                                       f"or idle for more than {self.ttl_s} s); call areset() to start one")
        self.counters["steps"] += 1
        episode.busy += 1
        try:
            result = await episode.env.astep(action)
            if snapshot_from is None:
                return result
            ended = result[2] or result[3]
            return result, None if ended else self._snapshot(episode.env, snapshot_from)
        finally:
            episode.busy -= 1
            episode.last_used = time.monotonic()

    @concurrent_endpoint
    async def restore(self, session_id: str, snapshot: dict[str, Any]) -> int:
        """Continue, as episode ``session_id``, the episode in ``snapshot`` (another replica's, now lost);
        returns the turn it continues from."""
        episode = self._open(session_id)
        self.counters["episodes_restored"] += 1
        episode.busy += 1
        try:
            await episode.env.arestore(snapshot)
            return snapshot["state"]["turn"]
        except Exception:
            if self.episodes.get(session_id) is episode:
                del self.episodes[session_id]
            raise
        finally:
            episode.busy -= 1
            episode.last_used = time.monotonic()

    def _snapshot(self, env: TextEnv, messages_from: int) -> dict[str, Any] | None:
        if not env.supports_snapshots:
            return None
        try:
            return env.snapshot(messages_from=messages_from)
        except SnapshotError as error:  # this episode goes on, as one its replica's death would lose
            logger.warning("%s: no snapshot of this episode: %s", self.env_id, error)
            return None

    @concurrent_endpoint
    async def close_episode(self, session_id: str) -> bool:
        """Close the episode and keep its environment for reuse; ``False`` if there was none."""
        episode = self.episodes.pop(session_id, None)
        if episode is None:
            return False
        await self._retire(episode.env)
        return True

    @concurrent_endpoint
    async def stats(self) -> dict[str, Any]:
        """Open episodes and counters of this replica."""
        return {"pid": os.getpid(), "open_episodes": len(self.episodes), "max_episodes": self.max_episodes,
                **self.counters}

    async def _retire(self, env: TextEnv) -> None:
        await env.aclose()
        if len(self.spare) < SPARE_ENVS:
            self.spare.append(env)

    def _start_reaper(self) -> None:
        if self._reaper is None and self.ttl_s is not None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever(self.ttl_s))

    async def _reap_forever(self, ttl_s: float) -> None:
        while True:
            await asyncio.sleep(min(max(ttl_s / 4, 0.05), 5.0))
            cutoff = time.monotonic() - ttl_s
            for session_id, episode in list(self.episodes.items()):
                if episode.last_used < cutoff and not episode.busy and self.episodes.get(session_id) is episode:
                    del self.episodes[session_id]
                    self.counters["episodes_reaped"] += 1
                    await self._retire(episode.env)

    async def __cleanup__(self, exc: Exception | None) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for episode in list(self.episodes.values()):
            await episode.env.aclose()
        self.episodes.clear()
