"""Spawning one Monarch replica: its process mesh (through the host's mesh owner), its actor, where its
processes run, and (``direct_calls``) the socket its concurrent endpoints are called over.

A spawn that does not answer within ``spawn_timeout_s`` counts as a host that is down; if it completes after
all, its mesh is stopped then and only then are its GPUs given back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from forge_env.services.direct_channel import DirectChannel
from forge_env.services.endpoints import endpoint_names, is_concurrent_endpoint
from forge_env.services.errors import HostUnreachableError, ReplicaSpawnError
from forge_env.services.monarch_backend import MonarchReplica, get_owner
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import GpuAllocator, host_gpus

logger = logging.getLogger(__name__)

_abandoned: set[asyncio.Task[None]] = set()


def _abandon(spawning: asyncio.Future[Any], owner: Any, name: str, gpus: GpuAllocator,
             gpu_ids: list[str] | None) -> None:
    """A spawn given up on may still finish (a slow host): stop its mesh then, and only then free its GPUs."""
    async def stop_when_done() -> None:
        try:
            await spawning
            await owner.stop_mesh.call_one(name)
        except Exception as error:  # it failed after all, or the mesh is gone: nothing runs there
            logger.debug("forge_env.services: abandoned spawn %s: %s", name, error)
        finally:
            if gpu_ids:
                gpus.give_back(gpu_ids)

    task = asyncio.get_running_loop().create_task(stop_when_done())
    _abandoned.add(task)
    task.add_done_callback(_abandoned.discard)


async def _open_channel(replica: MonarchReplica, actor_class: type, timeout: float) -> None:
    """Connect to the replica's socket for direct calls; if that fails, its calls keep going over Monarch."""
    try:
        address, token = await asyncio.wait_for(replica.mesh._forge_channel.call_one(), timeout)
        replica.channel = await asyncio.wait_for(DirectChannel.connect(address, token), timeout)
    except Exception as error:
        logger.warning("forge_env.services: %s: no direct channel (%s); calls go over Monarch", replica.name, error)
        return
    replica.direct = frozenset(name for name in endpoint_names(actor_class) if is_concurrent_endpoint(actor_class, name))


async def spawn_monarch_replica(actor_class: type, args: tuple, kwargs: dict, options: ServiceOptions,
                                name: str, host: tuple[Any, int] | None = None) -> MonarchReplica:
    """Spawn the processes and actor of one replica (on ``host``: a (HostGroup, index); else this host).

    Raises ``ReplicaSpawnError``; ``HostUnreachableError`` when the host did not answer in time.
    """
    where, owner, gpus = "this host", get_owner(), host_gpus()
    if host is not None:
        group, index = host
        slot = group.hosts[index]
        where, owner, gpus = slot.label, get_owner(slot.mesh), host_gpus(slot)
    gpu_ids = gpus.take(options.procs, name) if options.with_gpus else None
    env = dict(options.env)
    if not options.with_gpus:
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
    per_host = {"gpus" if options.with_gpus else "procs": options.procs}
    timeout = options.spawn_timeout_s
    spawning = asyncio.ensure_future(
        owner.spawn_mesh.call_one(name, actor_class, args, kwargs, per_host, env, gpu_ids))
    try:
        mesh = await asyncio.wait_for(asyncio.shield(spawning), timeout)
    except TimeoutError:
        _abandon(spawning, owner, name, gpus, gpu_ids)
        raise HostUnreachableError(f"spawning {name} on {where}: no answer within {timeout:g} s") from None
    except Exception as error:
        if gpu_ids:
            gpus.give_back(gpu_ids)
        raise ReplicaSpawnError(f"spawning {name} on {where} failed: {error}") from error
    replica = MonarchReplica(name, mesh, options.procs, gpu_ids, options, owner, gpus)
    if options.procs == 1 and options.batch_calls and getattr(actor_class, "_forge_batch", None) is not None:
        replica.batched = frozenset(name for name in endpoint_names(actor_class)
                                    if is_concurrent_endpoint(actor_class, name))
    try:
        where_ranks = await asyncio.wait_for(mesh._forge_where.call(), timeout)
        ranks = [where_ranks.get(rank) for rank in range(options.procs)]
        replica.pids = [r["pid"] for r in ranks]
        replica.machines = [r["machine"] for r in ranks]
        if options.direct_calls and options.procs == 1 and replica.local \
                and getattr(actor_class, "_forge_channel", None) is not None:
            await _open_channel(replica, actor_class, timeout)
    except TimeoutError:
        replica.options = replica.options.replace(spawn_timeout_s=1.0)  # do not wait long on a vanished host
        await replica.stop()
        raise HostUnreachableError(f"{name} on {where}: its processes did not answer within {timeout:g} s") from None
    except Exception as error:
        await replica.stop()
        raise ReplicaSpawnError(f"{name} did not start on {where} ({actor_class.__qualname__}.__init__ failed?): "
                                f"{error}") from error
    return replica
