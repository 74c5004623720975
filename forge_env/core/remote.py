"""What a rollout needs of an environment (``AsyncEnv``), and the rule the remote clients share.

``AsyncEnv`` is the one definition of the environment a rollout accepts (``agents.rollout.run_episode``,
``forge_env.core.demonstrations.demonstrate``): ``areset`` and ``astep`` with TextEnv's arguments and return
values. A local :class:`~forge_env.core.env.TextEnv` fits, and so do the two remote clients:

* ``forge_env.services.env_service.RemoteEnv``: an episode on a replica of an ``EnvService`` (Monarch actors
  on this or other hosts, called through the service's sticky sessions);
* ``forge_env.openenv.client_env.OpenEnvTextEnv``: an episode on an OpenEnv server (a WebSocket per episode,
  JSON frames, possibly another language's server; in ``tools`` mode the turn rules even run here).

The transports stay apart because they are different contracts: a Monarch service is this project's own
process mesh, with replicas, routing, health and respawn, and passes Python objects; OpenEnv is a public
wire protocol spoken to servers this project does not run, so every frame is checked and an error frame
has a code. What both clients share is the TextEnv-facing behaviour, :class:`RemoteSessions`: an episode
lives in one remote session, and a reset that finds the session lost (its replica died, its connection
broke) opens a fresh one and tries once more, since a reset has nothing to lose; a step is not simply retried
(the episode is gone with its session), though ``RemoteEnv`` resumes an episode whose environment snapshots
on another replica from its last completed turn (docs/services.md "Durable sessions").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

__all__ = ["AsyncEnv", "RemoteSessions"]


class AsyncEnv(Protocol):
    """What the rollout loop needs of an environment: TextEnv, RemoteEnv and OpenEnvTextEnv all fit.

    ``areset`` returns ``(observation, info)``; ``astep`` returns ``(observation, reward, terminated,
    truncated, info)``.
    """

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any: ...

    async def astep(self, action: Any) -> Any: ...


class RemoteSessions:
    """Mixin of the clients whose episodes run in a remote session (see the module docstring).

    A client says what a lost session looks like (``_session_lost``) and how to get a fresh one
    (``_renew_session``); ``_reset_remote`` runs one reset attempt under the shared rule.
    """

    def _session_lost(self, error: BaseException) -> bool:
        """Whether ``error`` means the session holding the episode is gone (not the episode's own fault)."""
        raise NotImplementedError

    async def _renew_session(self) -> None:
        """Leave the lost session; the next attempt runs in a fresh one."""
        raise NotImplementedError

    async def _reset_remote(self, attempt: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
        """``await attempt()``; when it finds the session lost (and ``retry``: the session was not just
        opened), renew the session and attempt once more."""
        try:
            return await attempt()
        except Exception as error:
            if not (retry and self._session_lost(error)):
                raise
        await self._renew_session()
        return await attempt()
