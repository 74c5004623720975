"""Where replicas run: host groups handed out by Monarch jobs, and a host for each replica.

A Monarch job (``monarch.job``: ``ProcessJob`` on one machine, ``SlurmJob``, Kubernetes, ...)
allocates named host meshes. Register them once and name a group in a service's options::

    from monarch.job import SlurmJob
    from forge_env.services import placement

    placement.use_job(SlurmJob({"cpu": 8, "gpu": 2}, ...))        # registers groups "cpu" and "gpu"
    envs = await EnvService.launch("forge_env/Coding-v0", num_replicas=32, hosts="cpu")

A service spreads its replicas over the group's hosts (fewest replicas first). When a
host dies its replicas are respawned on the others (within ``replicas_per_host``); a host
whose spawn does not answer is marked dead and skipped until :meth:`HostGroup.revive` (or
:meth:`HostGroup.add_host`) brings a host back. ``hosts=None`` keeps the default: this host.

Nothing here launches processes: jobs and their workers are Monarch's.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import pickle
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge_env.services.errors import ReplicaSpawnError

logger = logging.getLogger(__name__)

THIS_HOST = "this_host"


def machine_id() -> str:
    """This machine: hostname and boot id (equal only for processes on the same running kernel)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class PlacementError(ValueError):
    """A host group that does not exist, or a job spec that cannot be loaded."""


@dataclass
class HostSlot:
    """One host of a group: its single-host mesh and whether it is believed alive."""

    label: str
    mesh: Any
    gpus: int | None = None  # GPUs of this host, when the job says (replicas with_gpus get distinct ones)
    alive: bool = True
    suspect: bool = False  # a replica died there; try other hosts first until a spawn there succeeds
    last_failure: str = ""
    gpu_allocator: Any = None  # which of its GPUs replicas hold (a GpuAllocator, made by host_gpus on first use)


class HostGroup:
    """The hosts of one named Monarch host mesh, one slot per host."""

    def __init__(self, name: str, host_mesh: Any, gpus_per_host: int | None = None) -> None:
        self.name = name
        self.gpus_per_host = gpus_per_host
        self._lock = threading.Lock()
        self.hosts: list[HostSlot] = []
        self._add_mesh(host_mesh)

    def _add_mesh(self, host_mesh: Any) -> list[int]:
        count = _host_count(host_mesh)
        added = []
        for i in range(count):
            index = len(self.hosts)
            mesh = host_mesh.slice(hosts=i) if count > 1 else host_mesh
            self.hosts.append(HostSlot(f"{self.name}[{index}]", mesh, self.gpus_per_host))
            added.append(index)
        return added

    def add_host(self, host_mesh: Any) -> list[int]:
        """Add the hosts of ``host_mesh`` (a grown allocation, or a replacement worker); returns their indices."""
        with self._lock:
            return self._add_mesh(host_mesh)

    def revive(self, index: int, host_mesh: Any) -> None:
        """Host ``index`` is back (its worker restarted): use ``host_mesh`` (one host) for it from now on."""
        with self._lock:
            slot = self.hosts[index]
            slot.mesh, slot.alive, slot.suspect, slot.last_failure = host_mesh, True, False, ""
        logger.info("host %s is back in use", slot.label)

    def mark_dead(self, index: int, reason: str) -> None:
        """Stop placing replicas on host ``index`` (until :meth:`revive`)."""
        with self._lock:
            slot = self.hosts[index]
            if slot.alive:
                logger.warning("host %s marked dead: %s", slot.label, reason)
            slot.alive, slot.last_failure = False, reason

    def mark_suspect(self, index: int, reason: str) -> None:
        with self._lock:
            self.hosts[index].suspect = True
            self.hosts[index].last_failure = reason

    def mark_good(self, index: int) -> None:
        with self._lock:
            self.hosts[index].suspect = False

    def live(self) -> list[int]:
        return [i for i, slot in enumerate(self.hosts) if slot.alive]

    def __len__(self) -> int:
        return len(self.hosts)

    def __repr__(self) -> str:
        return f"<HostGroup {self.name}: {len(self.live())}/{len(self.hosts)} hosts alive>"


def _host_count(host_mesh: Any) -> int:
    sizes = getattr(host_mesh, "sizes", None) or {}
    if isinstance(sizes, dict) and sizes:
        count = 1
        for size in sizes.values():
            count *= int(size)
        return count
    return int(getattr(host_mesh, "size", 1) or 1)


_groups: dict[str, HostGroup] = {}
_groups_lock = threading.Lock()


def register_hosts(name: str, host_mesh: Any, gpus_per_host: int | None = None) -> HostGroup:
    """Register ``host_mesh`` (a Monarch ``HostMesh``) as the host group ``name``; replaces an older one.

    ``gpus_per_host``: the GPUs each host has, so replicas ``with_gpus`` get distinct devices there
    (unknown: ids are handed out from 0 up, and a replica beyond the host's count fails to start).
    """
    group = HostGroup(name, host_mesh, gpus_per_host)
    with _groups_lock:
        _groups[name] = group
    return group


def host_group(name: str) -> HostGroup:
    """The registered group ``name``; ``PlacementError`` naming the known ones otherwise."""
    with _groups_lock:
        group = _groups.get(name)
        known = sorted(_groups)
    if group is None:
        raise PlacementError(
            f"no host group {name!r}; known groups: {known or 'none'} (register them with "
            "forge_env.services.placement.use_job(job) or register_hosts(name, host_mesh), or pass --job)")
    return group


def host_groups() -> dict[str, HostGroup]:
    with _groups_lock:
        return dict(_groups)


def clear_host_groups() -> None:
    """Forget every registered group (their hosts are the job's: nothing is stopped)."""
    with _groups_lock:
        _groups.clear()


def resolve_hosts(hosts: Any) -> HostGroup | None:
    """A service's ``hosts`` option as a group: ``None`` (this host), a group name, a ``HostGroup`` or a mesh."""
    if hosts is None:
        return None
    if isinstance(hosts, HostGroup):
        return hosts
    if isinstance(hosts, str):
        return None if hosts == THIS_HOST else host_group(hosts)
    if hasattr(hosts, "spawn_procs") and hasattr(hosts, "slice"):
        return HostGroup(getattr(hosts, "_name", None) or "hosts", hosts)
    raise PlacementError(f"hosts={hosts!r}: expected a host group name, a HostGroup or a Monarch HostMesh")


def use_job(job: Any, *, cached_path: str | None = None) -> dict[str, HostGroup]:
    """Connect to a Monarch job (applying it if needed) and register each of its host meshes as a group."""
    state = job.state(cached_path=cached_path)
    meshes = getattr(state, "_hosts", None)
    if not isinstance(meshes, dict) or not meshes:
        raise PlacementError(f"{type(job).__name__}.state() gave no host meshes")
    gpus = getattr(job, "_gpus_per_node", None)  # SlurmJob's gpus_per_node, where the job says
    return {name: register_hosts(name, mesh, gpus) for name, mesh in meshes.items()}


def load_job(spec: str) -> Any:
    """A Monarch job from ``spec``: a ``.py`` file defining ``job``, a ``module.attr`` path, or a file
    written by ``job.dump(path)`` (Monarch's pickled job state, e.g. ``.monarch/job_state.pkl``)."""
    from monarch.job import JobTrait

    path = Path(spec)
    if path.suffix == ".py":
        if not path.is_file():
            raise PlacementError(f"--job {spec}: no such file")
        module_spec = importlib.util.spec_from_file_location(f"_forge_job_{path.stem}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        job = getattr(module, "job", None)
        where = f"{spec}: its 'job' variable"
    elif path.is_file():
        with open(path, "rb") as file:
            # a job state file is Monarch's own pickle, written by the user's job.dump(); trust as Monarch does
            job = pickle.load(file)  # noqa: S301
        where = spec
    elif "." in spec and os.sep not in spec:
        module_name, attr = spec.rsplit(".", 1)
        try:
            job = getattr(importlib.import_module(module_name), attr, None)
        except ImportError as error:
            raise PlacementError(f"--job {spec}: cannot import {module_name}: {error}") from error
        where = spec
    else:
        raise PlacementError(f"--job {spec}: expected a .py file defining `job`, a module.attr path, "
                             "or a job file written by job.dump()")
    if not isinstance(job, JobTrait):
        raise PlacementError(f"{where} is {type(job).__name__}, not a monarch.job job "
                             "(ProcessJob, SlurmJob, KubernetesJob, LocalJob, ...)")
    return job


class ReplicaPlacement:
    """One service's choice of host per replica: fewest replicas first, live hosts only, within a per-host cap."""

    def __init__(self, group: HostGroup | None, replicas_per_host: int | None) -> None:
        self.group = group
        self.replicas_per_host = replicas_per_host
        self.assigned: dict[int, int] = {}  # replica index -> host index

    def label(self, host: int | None) -> str:
        return THIS_HOST if host is None or self.group is None else self.group.hosts[host].label

    def choose(self, replica: int) -> int | None:
        """The host for ``replica`` (``None``: this host). ``PlacementError`` when no live host has room."""
        if self.group is None:
            return None
        self.assigned.pop(replica, None)
        counts = {i: 0 for i in self.group.live()}
        for host in self.assigned.values():
            if host in counts:
                counts[host] += 1
        room = [i for i, n in counts.items() if self.replicas_per_host is None or n < self.replicas_per_host]
        if not room:
            raise PlacementError(
                f"no live host of group {self.group.name!r} has room for replica {replica} "
                f"({len(self.group.live())}/{len(self.group)} hosts alive, replicas_per_host="
                f"{self.replicas_per_host})")
        # prefer hosts nobody suspects, then the emptiest; ties spread replicas by their index
        host = min(room, key=lambda i: (self.group.hosts[i].suspect, counts[i], (i - replica) % len(self.group)))
        self.assigned[replica] = host
        return host

    def release(self, replica: int) -> None:
        self.assigned.pop(replica, None)

    def spawned(self, host: int | None) -> None:
        if self.group is not None and host is not None:
            self.group.mark_good(host)

    def replica_died(self, host: int | None, reason: str) -> None:
        if self.group is not None and host is not None:
            self.group.mark_suspect(host, reason)

    def host_unreachable(self, host: int | None, reason: str) -> None:
        if self.group is not None and host is not None:
            self.group.mark_dead(host, reason)


class GpuAllocator:
    """Hands out a host's GPU ids to replicas with ``with_gpus``: this host's visible devices
    (``CUDA_VISIBLE_DEVICES``, else all), or ``0..count-1`` of a job host with ``count`` GPUs."""

    def __init__(self, count: int | None = None, where: str = "this host") -> None:
        self.count = count
        self.where = where
        self.taken: set[str] = set()
        self.lock = threading.Lock()

    def _visible(self) -> list[str]:
        if self.count is not None:
            return [str(i) for i in range(self.count)]
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
                    f"{who} needs {count} GPU(s) but {len(free)} are free on {self.where} ({len(self.taken)} in use "
                    "by other replicas); lower procs/num_replicas or use with_gpus=False")
            self.taken.update(free[:count])
            return free[:count]

    def give_back(self, ids: list[str]) -> None:
        with self.lock:
            self.taken.difference_update(ids)


_this_host_gpus = GpuAllocator()
_gpus_lock = threading.Lock()


def host_gpus(slot: HostSlot | None = None) -> GpuAllocator:
    """The GPU allocator of a job host (kept on its slot, so it lives and dies with the slot), or of this host."""
    if slot is None:
        return _this_host_gpus
    with _gpus_lock:
        if slot.gpu_allocator is None:
            slot.gpu_allocator = GpuAllocator(slot.gpus, slot.label)
        return slot.gpu_allocator


def reserve_gpus(count: int, who: str) -> list[str]:
    """Mark ``count`` of this host's GPUs as used by ``who`` outside any service (e.g. a trainer in the
    driver process), so replicas spawned later with ``with_gpus`` get other devices. Returns their ids
    (``ReplicaSpawnError`` if fewer are free)."""
    return _this_host_gpus.take(count, who)
