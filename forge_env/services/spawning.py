"""Starting one replica on a backend (on the host its placement picks), and the names and host labels
replicas are known by."""

from __future__ import annotations

import re

from forge_env.services.endpoints import endpoint_names
from forge_env.services.errors import HostUnreachableError, ReplicaSpawnError
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import THIS_HOST, HostGroup, PlacementError, ReplicaPlacement
from forge_env.services.replica import ReplicaDown, ReplicaHandle


async def spawn_handle(actor_class: type, args: tuple, kwargs: dict, options: ServiceOptions, name: str,
                       host: tuple[HostGroup, int] | None = None) -> ReplicaHandle:
    """Start one replica on the configured backend (on ``host`` of a group, else this host) and run its
    ``setup`` endpoint (if it has one)."""
    if options.backend == "local":
        from forge_env.services.local_backend import spawn_local_replica

        handle: ReplicaHandle = await spawn_local_replica(actor_class, args, kwargs, name)
    else:
        from forge_env.services.monarch_spawn import spawn_monarch_replica

        handle = await spawn_monarch_replica(actor_class, args, kwargs, options, name, host)
    if "setup" in endpoint_names(actor_class):
        try:
            await handle.call("setup", (), {})
        except (Exception, ReplicaDown) as error:
            await handle.stop()
            raise ReplicaSpawnError(f"{name}: setup() failed: {type(error).__name__}: {error}") from error
    return handle


def host_label(handle: ReplicaHandle | None) -> str:
    return getattr(handle, "host_label", THIS_HOST) if handle is not None else ""


def mesh_name(*parts: object) -> str:
    """A Monarch-safe mesh name (Monarch appends '-<suffix>' and lower-cases names in its reports)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", "_".join(str(p) for p in parts))


class ReplicaSpawner:
    """Spawns the replicas of one service where its placement says; a host that does not answer is marked dead
    and the next one tried."""

    def __init__(self, actor_class: type, args: tuple, kwargs: dict, options: ServiceOptions, service_name: str,
                 mesh_prefix: str, placement: ReplicaPlacement) -> None:
        self.actor_class = actor_class
        self.args = args
        self.kwargs = kwargs
        self.options = options
        self.service_name = service_name
        self.mesh_prefix = mesh_prefix
        self.placement = placement
        self.spawns = 0

    async def spawn(self, index: int) -> ReplicaHandle:
        """Spawn replica ``index``; ``ReplicaSpawnError`` when no host is left or the replica fails to start."""
        placement = self.placement
        while True:
            # a fresh name per attempt: Monarch may still hold a mesh of that name on a host that vanished
            self.spawns += 1
            name = mesh_name(self.mesh_prefix, "r", index, "s", self.spawns)
            try:
                host = placement.choose(index)
            except PlacementError as error:
                raise ReplicaSpawnError(f"{self.service_name}: {error}") from error
            target = None if host is None else (placement.group, host)
            try:
                handle = await spawn_handle(self.actor_class, self.args, self.kwargs, self.options, name, target)
            except HostUnreachableError as error:
                placement.release(index)
                if host is None:
                    raise
                placement.host_unreachable(host, str(error))
                continue
            except BaseException:
                placement.release(index)
                raise
            placement.spawned(host)
            handle.host = host  # type: ignore[attr-defined]
            handle.host_label = placement.label(host)  # type: ignore[attr-defined]
            return handle
