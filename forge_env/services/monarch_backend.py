"""Replicas as real Monarch process meshes.

Every replica is its own ``ProcMesh`` (``procs`` processes on this host) with one actor
mesh on it. Meshes are spawned by a small owner actor living in this process
(:class:`MeshOwner`): Monarch reports the failure of a mesh to its owner's
``__supervise__``, and an owner that handles it keeps the failure from reaching the
root client, whose default reaction is to exit the whole program. The owner forwards
each failure to the service that holds the replica.

Monarch learns that a replica process was killed only after several seconds, so each
replica's processes are also watched with a pidfd: the service hears of a death in
well under a millisecond and fails the calls in flight at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import Actor, ActorError, concurrent_endpoint, current_rank, this_host, this_proc

from forge_env.services.errors import ReplicaSpawnError
from forge_env.services.options import ServiceOptions
from forge_env.services.replica import ReplicaDown

logger = logging.getLogger(__name__)

# mesh name (lower case, as Monarch reports it) -> callback(reason); called from Monarch's thread
_failure_listeners: dict[str, Callable[[str], None]] = {}
_listeners_lock = threading.Lock()
_owner: Any = None
_owner_lock = threading.Lock()


def _apply_process_env(env: dict[str, str], gpu_ids: list[str] | None) -> None:
    """Bootstrap of each replica process: environment variables, and its GPU if it has one."""
    os.environ.update(env)
    if gpu_ids is not None:
        rank = current_rank().rank
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_ids[rank] if rank < len(gpu_ids) else ""


class MeshOwner(Actor):
    """Owns the replicas' process meshes so their failures come here, not to the root client."""

    def __init__(self) -> None:
        self.meshes: dict[str, Any] = {}

    @concurrent_endpoint
    async def spawn_mesh(self, name: str, actor_class: type, args: tuple, kwargs: dict,
                         per_host: dict[str, int], env: dict[str, str], gpu_ids: list[str] | None) -> Any:
        bootstrap = functools.partial(_apply_process_env, env, gpu_ids)
        procs = this_host().spawn_procs(per_host=per_host, name=name, bootstrap=bootstrap)
        self.meshes[name] = procs
        return procs.spawn(name, actor_class, *args, **kwargs)

    @concurrent_endpoint
    async def stop_mesh(self, name: str) -> None:
        procs = self.meshes.pop(name, None)
        if procs is not None:
            await procs.stop()

    def __supervise__(self, failure: Any) -> bool:
        name = str(failure.mesh_name).lower()
        with _listeners_lock:
            listener = _failure_listeners.get(name.rsplit("-", 1)[0]) or _failure_listeners.get(name)
        if listener is not None:
            listener(failure.report())
        else:  # the logger mesh of a replica's procs, or a replica already stopped
            logger.debug("forge_env.services: mesh failure not attributed to a live replica: %s", name)
        return True


def _get_owner() -> Any:
    """The process-wide mesh owner actor (spawned in this process on first use)."""
    global _owner
    with _owner_lock:
        if _owner is None:
            _owner = this_proc().spawn("forge_env_mesh_owner", MeshOwner)
        return _owner


class _GpuAllocator:
    """Hands out this host's GPU ids (``CUDA_VISIBLE_DEVICES``, else all devices) to replicas with ``with_gpus``."""

    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.lock = threading.Lock()

    @staticmethod
    def _visible() -> list[str]:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return [d.strip() for d in visible.split(",") if d.strip()]
        import torch  # only services that ask for GPUs pay for this import

        return [str(i) for i in range(torch.cuda.device_count())]

    def take(self, count: int, who: str) -> list[str]:
        with self.lock:
            free = [d for d in self._visible() if d not in self.taken]
            if len(free) < count:
                raise ReplicaSpawnError(
                    f"{who} needs {count} GPU(s) but {len(free)} are free on this host ({len(self.taken)} in use "
                    "by other replicas); lower procs/num_replicas or use with_gpus=False")
            self.taken.update(free[:count])
            return free[:count]

    def give_back(self, ids: list[str]) -> None:
        with self.lock:
            self.taken.difference_update(ids)


_gpus = _GpuAllocator()


def reserve_gpus(count: int, who: str) -> list[str]:
    """Mark ``count`` of this host's GPUs as used by ``who`` outside any service (e.g. a trainer in the
    driver process), so replicas spawned later with ``with_gpus`` get other devices. Returns their ids."""
    return _gpus.take(count, who)


class MonarchReplica:
    """One replica: a process mesh with one actor per process. Calls go to all ranks; rank 0 answers."""

    def __init__(self, name: str, mesh: Any, procs: int, gpu_ids: list[str] | None) -> None:
        self.name = name
        self.mesh = mesh
        self.procs = procs
        self.gpu_ids = gpu_ids
        self.pids: list[int] = []
        self._pidfds: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    async def call(self, endpoint: str, args: tuple, kwargs: dict) -> Any:
        """Call ``endpoint``; an application error is re-raised as itself, a dead replica as ``ReplicaDown``."""
        port = getattr(self.mesh, endpoint)
        try:
            if self.procs == 1:
                return await port.call_one(*args, **kwargs)
            return (await port.call(*args, **kwargs)).get(0)
        except ActorError as error:
            raise error.exception from error
        except SupervisionError as error:
            raise ReplicaDown(str(error)) from error

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call ``on_death`` (on the running loop) as soon as any process of this replica exits or Monarch reports it failed."""
        loop = asyncio.get_running_loop()
        self._loop = loop

        def from_monarch(report: str) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(on_death, f"Monarch reported a failure: {report}")

        with _listeners_lock:
            _failure_listeners[self.name.lower()] = from_monarch
        for pid in self.pids:
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):  # no pidfd (old kernel): Monarch's report still arrives
                continue
            self._pidfds.append(fd)
            loop.add_reader(fd, functools.partial(self._process_exited, pid, on_death))

    def _process_exited(self, pid: int, on_death: Callable[[str], None]) -> None:
        self._close_watch()
        if not self._stopped:
            on_death(f"process {pid} exited")

    def _close_watch(self) -> None:
        for fd in self._pidfds:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(fd)
            os.close(fd)
        self._pidfds = []

    async def stop(self) -> None:
        """Stop the replica's processes (best effort: a dead replica has nothing left to stop)."""
        if self._stopped:
            return
        self._stopped = True
        self._close_watch()
        with _listeners_lock:
            _failure_listeners.pop(self.name.lower(), None)
        if self.gpu_ids:
            _gpus.give_back(self.gpu_ids)
        try:
            await _get_owner().stop_mesh.call_one(self.name)
        except Exception as error:  # the mesh may already be gone with its processes
            logger.debug("forge_env.services: stopping %s: %s", self.name, error)


async def spawn_monarch_replica(actor_class: type, args: tuple, kwargs: dict, options: ServiceOptions,
                                name: str) -> MonarchReplica:
    """Spawn the processes and actor of one replica and learn their pids."""
    gpu_ids = _gpus.take(options.procs, name) if options.with_gpus else None
    env = dict(options.env)
    if not options.with_gpus:
        env.setdefault("CUDA_VISIBLE_DEVICES", "")
    per_host = {"gpus" if options.with_gpus else "procs": options.procs}
    try:
        mesh = await _get_owner().spawn_mesh.call_one(name, actor_class, args, kwargs, per_host, env, gpu_ids)
    except Exception as error:
        if gpu_ids:
            _gpus.give_back(gpu_ids)
        raise ReplicaSpawnError(f"spawning {name} failed: {error}") from error
    replica = MonarchReplica(name, mesh, options.procs, gpu_ids)
    try:
        pids = await mesh._forge_pid.call()
        replica.pids = [pids.get(rank) for rank in range(options.procs)]
    except Exception as error:
        await replica.stop()
        raise ReplicaSpawnError(f"{name} did not start ({actor_class.__qualname__}.__init__ failed?): {error}") from error
    return replica
