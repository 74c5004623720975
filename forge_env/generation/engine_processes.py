"""Reaping the engine processes a ``VLLMGenerator`` started, once vLLM's shutdown has stopped (or killed) them.

vLLM stops its engine-core process with SIGTERM and, if it has not exited within its grace (5 s; a loaded
engine can ignore SIGTERM that long), SIGKILLs it and its workers (``kill_process_tree``), but never waits
for them: the engine core stays an unreaped child (a zombie) of the generator's process until something
happens to wait for it, and a killed worker may still hold its memory when ``close()`` returns.
:class:`EngineProcesses` notes the engine's processes before the shutdown; :meth:`EngineProcesses.reap`
then reaps the engine cores and waits for their workers to be gone, bounded, killing what still runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


class EngineProcesses:
    """The processes of one ``AsyncLLM``: its engine cores (our children) and their descendants (workers)."""

    def __init__(self, engine: Any) -> None:
        resources = getattr(getattr(engine, "engine_core", None), "resources", None)
        processes = getattr(getattr(resources, "engine_manager", None), "processes", None)
        # multiprocessing processes: join() reaps them and keeps multiprocessing's own bookkeeping right
        self.cores = [p for p in processes or () if callable(getattr(p, "join", None)) and p.pid is not None]
        self.workers = self._descendants()

    def _descendants(self) -> list[Any]:
        try:
            import psutil  # a vLLM dependency
        except ImportError:  # pragma: no cover - vLLM brings psutil
            return []
        found = []
        for core in self.cores:
            try:
                found.extend(psutil.Process(core.pid).children(recursive=True))
            except psutil.Error:
                pass
        return found

    def reap(self, timeout_s: float = 10.0, kill_grace_s: float = 5.0) -> list[int]:
        """Reap the engine cores and wait for the workers to exit (``timeout_s`` in all); kill what still runs.

        Returns the pids still running after SIGKILL and ``kill_grace_s`` more (e.g. stuck in an
        uninterruptible sleep); they are logged.
        """
        deadline = time.monotonic() + timeout_s
        for core in self.cores:
            core.join(max(0.0, deadline - time.monotonic()))
        running = self._running(deadline)
        if running:
            logger.warning("engine processes %s still ran after vLLM's shutdown; killing them", running)
            for core in self.cores:
                if core.exitcode is None:
                    core.kill()
            for worker in self.workers:
                _kill(worker)
            for core in self.cores:
                core.join(kill_grace_s)
            running = self._running(time.monotonic() + kill_grace_s)
            if running:
                logger.error("engine processes %s outlived SIGKILL by %g s", running, kill_grace_s)
        return running

    def _running(self, deadline: float) -> list[int]:
        """Pids of the engine's processes still running at ``deadline`` (polled; a zombie counts as exited)."""
        while True:
            running = [c.pid for c in self.cores if c.exitcode is None]
            running += [w.pid for w in self.workers if _alive(w)]
            if not running or time.monotonic() >= deadline:
                return running
            time.sleep(0.05)


def _alive(process: Any) -> bool:
    """Whether a psutil process still runs: gone or a zombie (not ours to reap: init's) counts as exited."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(process: Any) -> None:
    import psutil

    try:
        process.kill()  # psutil checks the pid still names the same process (no kill of a reused pid)
    except psutil.Error:
        pass
