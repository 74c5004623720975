"""Starting one replica on a backend, and the names and host labels replicas are known by."""

from __future__ import annotations

import re

from forge_env.services.endpoints import endpoint_names
from forge_env.services.errors import ReplicaSpawnError
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import THIS_HOST, HostGroup
from forge_env.services.replica import ReplicaDown, ReplicaHandle


async def spawn_handle(actor_class: type, args: tuple, kwargs: dict, options: ServiceOptions, name: str,
                       host: tuple[HostGroup, int] | None = None) -> ReplicaHandle:
    """Start one replica on the configured backend (on ``host`` of a group, else this host) and run its
    ``setup`` endpoint (if it has one)."""
    if options.backend == "local":
        from forge_env.services.local_backend import spawn_local_replica

        handle: ReplicaHandle = await spawn_local_replica(actor_class, args, kwargs, name)
    else:
        from forge_env.services.monarch_backend import spawn_monarch_replica

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
