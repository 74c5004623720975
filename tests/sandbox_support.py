"""Shared helpers for the sandbox tests: a small, strict sandbox and a host-side process finder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal

import pytest

from forge_env.sandbox import make_sandbox
from forge_env.sandbox.bwrap import python_roots
from forge_env.sandbox.interpreter import lean_python
from tests.docker_support import requires_docker
from tests.trust_boundary import requires

requires_bwrap = requires("bwrap", "bubblewrap (bwrap) is not on PATH" if shutil.which("bwrap") is None else None)

#: Both backends, for the suites that must hold on each (tests/test_sandbox_hostile.py, test_sandbox_hardening.py).
BACKENDS = [pytest.param("process", marks=requires_bwrap),
            pytest.param("docker", marks=[pytest.mark.docker, requires_docker])]

#: The interpreter's directories that live under /tmp (a clone in /tmp): bound read-only into the
#: sandbox's private /tmp, so they show up there and are never wiped.
KEPT_UNDER_TMP = tuple(root for root in python_roots(lean_python()) if root.startswith("/tmp/"))


def tmp_listing(*entries: str, backend: str = "process") -> list[str]:
    """What ``sorted(os.listdir('/tmp'))`` shows in a sandbox holding ``entries`` (a bubblewrap one also
    shows the interpreter's directories under /tmp; a container's image has none there)."""
    kept = KEPT_UNDER_TMP if backend == "process" else ()
    return sorted({*entries, *(root.split("/")[2] for root in kept)})


#: Tight limits so hostile programs hit them quickly.
TEST_LIMITS = dict(cpu_seconds=3, wall_timeout_s=5, memory_mb=256, max_processes=16, file_size_mb=2,
                   open_files=32, max_output_bytes=16 * 1024, workdir_size_mb=16)


def strict_sandbox(backend: str = "process", **overrides):
    """A sandbox with :data:`TEST_LIMITS`: bubblewrap for ``process``, the sandbox image for ``docker``."""
    isolation = {"isolation": "bwrap"} if backend == "process" else {}
    return make_sandbox(backend, **{**TEST_LIMITS, **isolation, "max_concurrency": 2, **overrides})


def host_processes_matching(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (zombies have an empty one and are not counted)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry))
    return found


class WorkerKiller:
    """The real sandbox, except that while a run that ``marked(code, kwargs)`` picks is in flight, the host
    kills (SIGKILL) the worker's fork server, for the first ``times`` such runs (None: every one). The marked
    code must still be running ``in_flight_s`` after it started (it sleeps at load)."""

    def __init__(self, real, times: int | None, marked, in_flight_s: float = 0.2):
        self.real, self.limits, self.times, self.marked, self.in_flight_s = real, real.limits, times, marked, in_flight_s
        self.kills = 0
        self.runs = 0

    async def run(self, code, **kwargs):
        self.runs += 1
        if not self.marked(code, kwargs) or (self.times is not None and self.kills >= self.times):
            return await self.real.run(code, **kwargs)
        started = self.real.stats.runs
        running = asyncio.ensure_future(self.real.run(code, **kwargs))
        while self.real.stats.runs == started and not running.done():
            await asyncio.sleep(0.005)
        await asyncio.sleep(self.in_flight_s)
        assert not running.done(), "the run ended before the host could kill its worker"
        os.kill(self.real.worker_pids[-1], signal.SIGKILL)  # the fork server (one slot: the run's worker)
        self.kills += 1
        return await running

    def session(self):
        return self.real.session()



@contextlib.asynccontextmanager
async def small_sandbox():
    """One small bubblewrap sandbox: one run at a time, 5 s wall, 3 CPU-s, 256 MB (closed on exit)."""
    sb = make_sandbox("process", isolation="bwrap", max_concurrency=1, wall_timeout_s=5, cpu_seconds=3,
                      memory_mb=256)
    try:
        yield sb
    finally:
        await sb.close()
