"""A memory cgroup per sandbox worker, so the kernel counts all of a worker's memory, not only its heap.

``RLIMIT_AS`` bounds each process's address space, but not pages that belong to no mapping for long: a
``memfd`` written then unmapped, SysV shared memory touched and detached, files in a tmpfs, and the
kernel's own objects (inodes, dentries) a run creates. A memory cgroup charges all of these to the
worker, and when it is full the kernel's OOM killer picks a run process (they ask to be picked first).

Both cgroup versions are handled: v1 (a ``memory`` hierarchy, as on these machines) and v2 (the unified
hierarchy, where the parent must delegate the ``memory`` controller). The worker's cgroup is created under
the caller's own cgroup. Where neither can be used (typically a caller that is not root and has no
delegated v2 subtree) :func:`memory_cgroups` says why, and the sandbox logs a warning: memory is then
bounded only by ``RLIMIT_AS`` and the tmpfs sizes.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os

logger = logging.getLogger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
_names = itertools.count()


@functools.lru_cache(maxsize=1)
def memory_cgroups() -> tuple[str | None, str]:
    """("v1" | "v2", parent directory) where worker cgroups can be made, or (None, why not)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup: {exc}"
    v1 = [line.split(":", 2)[2] for line in lines if "memory" in line.split(":", 2)[1].split(",")]
    if v1 and os.path.isdir(f"{CGROUP_ROOT}/memory"):
        parent = f"{CGROUP_ROOT}/memory{v1[0].rstrip('/')}"
        version = "v1"
    elif os.path.exists(f"{CGROUP_ROOT}/cgroup.controllers"):
        own = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
        parent = f"{CGROUP_ROOT}{own.rstrip('/')}"
        version = "v2"
    else:
        return None, "no memory cgroup hierarchy is mounted"
    probe = os.path.join(parent, f"forge-sandbox-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return None, f"cannot create a cgroup under {parent}: {exc.strerror}"
    try:
        if version == "v2" and not os.path.exists(os.path.join(probe, "memory.max")):
            try:
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
            except OSError as exc:
                return None, f"the memory controller is not delegated to {parent}: {exc.strerror}"
    finally:
        os.rmdir(probe)
    return version, parent


class MemoryCgroup:
    """One worker's memory cgroup: create it with a limit, put the worker in it, read its OOM kills."""

    def __init__(self, version: str, path: str) -> None:
        self.version, self.path = version, path

    @classmethod
    def create(cls, limit_bytes: int) -> MemoryCgroup | None:
        version, parent = memory_cgroups()
        if version is None:
            return None
        path = os.path.join(parent, f"forge-sandbox-{os.getpid()}-{next(_names)}")
        os.mkdir(path)
        group = cls(version, path)
        try:
            if version == "v1":
                group._write("memory.limit_in_bytes", limit_bytes)
                group._write("memory.memsw.limit_in_bytes", limit_bytes, optional=True)  # no escape into swap
            else:
                group._write("memory.max", limit_bytes)
                group._write("memory.swap.max", 0, optional=True)
        except BaseException:
            group.remove()
            raise
        return group

    def _write(self, name: str, value: int, optional: bool = False) -> None:
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(str(value))
        except FileNotFoundError:
            if not optional:
                raise

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run from inside this cgroup (a shell joins it, then execs the command)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(self.path, "cgroup.procs"), *argv]

    def oom_kills(self) -> int:
        """How many processes the kernel killed for want of memory in this cgroup so far."""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        try:
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            pass
        return 0

    def usage_bytes(self) -> int:
        name = "memory.usage_in_bytes" if self.version == "v1" else "memory.current"
        with open(os.path.join(self.path, name)) as f:
            return int(f.read())

    def remove(self) -> bool:
        """Remove the cgroup; False while processes are still in it."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True


def clean_exit(reply: dict) -> bool:
    """Whether a run's reply shows it ended on its own with status 0: then its OOM counter is not read (the
    OOM killer sends SIGKILL), which saves a file read per run on the happy path. A subprocess killed for
    memory during a clean run is counted at the next run that does not end cleanly."""
    return reply.get("exit_code") == 0 and reply.get("killed_reason") is None


def worker_memory_bytes(memory_mb: int, workdir_size_mb: int) -> int:
    """A worker's memory budget: one run's address space, its two tmpfs (/tmp, /dev/shm), and room for the
    server and zygote (the same sum the docker backend gives a container)."""
    return (memory_mb + 2 * workdir_size_mb + 128) * 1024 * 1024
