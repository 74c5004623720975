"""Talking to the Docker engine for the docker backend: its errors, removing containers (also those an
outage or a killed owner left), and reaching a local container's processes and memory cgroup directly.

The SDK is imported lazily (:func:`docker_module`), so importing this module costs nothing without it.
"""

from __future__ import annotations

import logging
import os
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
