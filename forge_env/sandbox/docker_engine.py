"""Talking to the Docker engine for the docker backend: its errors, removing containers (also those an
outage or a killed owner left), reaching a local container's processes and memory cgroup directly, and
measuring a container's writable layer.

The SDK is imported lazily (:func:`docker_module`), so importing this module costs nothing without it.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any

from forge_env.sandbox.base import SandboxUnavailableError
from forge_env.sandbox.cgroup import CGROUP_ROOT, MemoryCgroup

logger = logging.getLogger(__name__)

#: Every sandbox container carries this label (its value: the owning sandbox's own label).
LABEL = "forge_env.sandbox"


def docker_module() -> Any:
    """The docker SDK, or SandboxUnavailableError saying how to install it."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailableError("the docker backend needs the docker SDK: pip install 'forge-env[docker]'") from exc
    return docker


def explain(exc: BaseException) -> str:
    """The engine's own words for a failure (an APIError's explanation), else the exception's text."""
    return str(getattr(exc, "explanation", None) or exc).strip() or type(exc).__name__


def engine_errors() -> tuple[type[BaseException], ...]:
    """What the SDK raises when the engine refuses or is unreachable (requests' errors are OSErrors)."""
    return (docker_module().errors.DockerException, OSError)


def local_process(container: Any) -> tuple[int | None, MemoryCgroup | None]:
    """(a pidfd for the container's main process, the container's memory cgroup) when the engine runs on
    this machine, else Nones: the pidfd lets the host kill the container's processes even when the engine
    has gone away, and the cgroup's OOM-kill counter tells a run killed for want of memory."""
    try:
        container.reload()
        pid = int(container.attrs["State"]["Pid"])
        fd = os.pidfd_open(pid) if pid > 0 else None
    except (*engine_errors(), AttributeError, KeyError, ValueError):
        return None, None
    if fd is None:
        return None, None
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            cgroups = f.read()
    except OSError:
        cgroups = ""
    if container.id not in cgroups:  # not this container's process (a remote engine's pid)
        os.close(fd)
        return None, None
    return fd, memory_cgroup(cgroups)


def memory_cgroup(cgroups: str) -> MemoryCgroup | None:
    """The memory cgroup (v1 or v2) of a process, from its /proc/PID/cgroup, when the host shows it."""
    for line in cgroups.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            group, counter = MemoryCgroup("v1", f"{CGROUP_ROOT}/memory{path}"), "memory.oom_control"
        elif controllers == "":
            group, counter = MemoryCgroup("v2", f"{CGROUP_ROOT}{path}"), "memory.events"
        else:
            continue
        if os.path.exists(os.path.join(group.path, counter)):
            return group
    return None


def engine_limits_pids(client: Any) -> bool:
    """Whether the engine enforces a container's ``pids_limit`` (its ``PidsLimit`` capability)."""
    try:
        return bool(client.info().get("PidsLimit"))
    except engine_errors():
        return False


def layer_usage(api: Any, container_id: str, max_bytes: float, max_paths: int, timeout: float,
                local: bool = True) -> tuple[int, int]:
    """(apparent bytes of its regular files, paths) of a (paused) container's writable layer, or ValueError
    when it cannot be measured for what it holds. Read on this machine from the overlay upper directory when
    the engine is local and it is readable, stopping once past either limit (the cost is bounded by the
    limits, not by what the code wrote); else asked of the engine (its size walk and its list of changes,
    which cost as much as the layer holds, and fail on paths longer than the host's PATH_MAX; ``local=False``
    forces that)."""
    def get(path: str, **params: Any) -> Any:
        return api._result(api._get(api._url(path, container_id), params=params, timeout=timeout), True)

    upper = ((get("/containers/{0}/json").get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
    if local and upper and os.path.isdir(upper) and os.access(upper, os.R_OK | os.X_OK):
        return _walk_layer(upper, max_bytes, max_paths)
    size = get("/containers/{0}/json", size=1).get("SizeRw")
    try:
        changes = get("/containers/{0}/changes")
    except docker_module().errors.APIError as exc:
        if "file name too long" not in explain(exc):
            raise
        changes = None
    if size is None or size < 0 or changes is None:
        raise ValueError("the engine could not measure them (paths longer than the host allows?)")
    return size, len(changes)


def _walk_layer(upper: str, max_bytes: float, max_paths: int) -> tuple[int, int]:
    """:func:`layer_usage` on this machine: a depth-first walk by directory fds (one open at a time, ``..`` to
    climb: paths of any length), listing each directory only as far as the paths left allow."""
    def listing(fd: int, budget: int) -> list[str]:
        names: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                names.append(entry.name)
                if len(names) > budget:
                    break
        return names

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open(upper, flags)
    try:
        stack = [listing(fd, max_paths)]
        size, paths, seen = 0, len(stack[0]), set()
        while stack and size <= max_bytes and paths <= max_paths:
            if not stack[-1]:
                stack.pop()
                if stack:
                    parent = os.open("..", flags, dir_fd=fd)
                    os.close(fd)
                    fd = parent
                continue
            name = stack[-1].pop()
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                child = os.open(name, flags, dir_fd=fd)
                os.close(fd)
                fd = child
                stack.append(listing(fd, max_paths - paths))
                paths += len(stack[-1])
            elif stat.S_ISREG(info.st_mode) and (info.st_nlink == 1 or info.st_ino not in seen):
                seen.add(info.st_ino)
                size += info.st_size
        return size, paths
    finally:
        os.close(fd)


def remove_container(client: Any, container_id: str) -> bool:
    """Force-remove one container and its anonymous volumes; True when it is gone (removed now or already)."""
    docker = docker_module()
    try:
        client.api.remove_container(container_id, force=True, v=True)
        return True
    except docker.errors.NotFound:
        return True
    except docker.errors.APIError as exc:
        if "already in progress" in explain(exc):
            return True
        logger.warning("could not remove sandbox container %s: %s", container_id[:12], explain(exc))
        return False
    except engine_errors() as exc:
        logger.warning("could not remove sandbox container %s (the engine does not answer: %s); it is removed "
                       "once the engine answers again", container_id[:12], exc)
        return False


def remove_containers(client: Any, ids: set[str]) -> None:
    """Remove every container in ``ids``; those the engine could not remove stay in the set."""
    for container_id in list(ids):
        if remove_container(client, container_id):
            ids.discard(container_id)


def remove_exited_containers(client: Any) -> int:
    """Remove sandbox containers of any owner that have stopped (left behind by an engine outage or a
    killed owner: a stopped worker is never used again). Returns how many were removed."""
    try:
        stale = client.api.containers(all=True, quiet=True, filters={"label": LABEL, "status": ["exited", "dead"]})
    except engine_errors():
        return 0
    return sum(remove_container(client, entry["Id"]) for entry in stale)
