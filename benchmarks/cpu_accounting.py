"""CPU accounting and machine description for the sandbox benchmark (``sandbox_bench.py``).

CPU time of processes by pid (with the children they reaped), of a process tree, of this process; the Docker
engine's processes; the CPU model, kernel, THP mode and CPU-bug mitigations, and the load average that every
figure is labelled with; other processes kept busy to load the machine on purpose.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
from collections.abc import Iterator

ENGINE_PROCESSES = ("dockerd", "containerd", "containerd-shim")  # comm names (at most 15 characters)


def process_cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds, of which system) of ``pid`` and of the children it has reaped (from /proc; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    user, system, children_user, children_system = (int(x) / ticks for x in fields[11:15])
    return user + system + children_user + children_system, system + children_system


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a worker's server holds its zygote and runs forked ahead of time,
    whose CPU is in no reaped-children total until they end)."""
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as f:
                stack.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            pass
    return found


def cpu_model() -> str:
    """The CPU model (and vendor) this ran on, from /proc/cpuinfo."""
    model = vendor = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "vendor_id" and vendor == "unknown":
                    vendor = value.strip()
    except OSError:
        pass
    return f"{model} ({vendor}, {os.cpu_count()} CPUs)"


def kernel_line() -> str:
    """The kernel, its transparent-huge-page mode and the CPU-bug mitigations it applies: what a kernel entry
    (a fault, a syscall) costs differs with them, and a check is mostly kernel entries (docs/sandbox.md)."""
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "?"

    thp = read("/sys/kernel/mm/transparent_hugepage/enabled")
    thp = thp[thp.find("[") + 1:thp.find("]")] if "[" in thp else thp
    folder = "/sys/devices/system/cpu/vulnerabilities"
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    applied = [f"{name}: {read(f'{folder}/{name}')}" for name in names]
    applied = [entry for entry in applied if not entry.endswith(("Not affected", "?"))]
    return f"kernel {os.uname().release}, THP {thp}; mitigations: {'; '.join(applied) or 'none listed'}"


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` other processes spinning on the CPU (reaped only after the figures are taken, so their
    CPU is never counted as ours)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def own_cpu() -> tuple[float, float]:
    """(CPU seconds, of which system) of this process and of the children it has reaped."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    system = me.ru_stime + children.ru_stime
    return me.ru_utime + children.ru_utime + system, system


def engine_pids() -> list[int]:
    """Host pids of the Docker engine's processes (dockerd, containerd, the containers' shims)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() in ENGINE_PROCESSES:
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found
