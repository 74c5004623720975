"""Who may cancel a grade: only the machine, never the graded code.

A grading run that comes back with ``killed_reason="sandbox_error"`` (its worker died, hung or broke the
protocol, and the pool replaced it) does not say whose doing that was: the machine's (an engine restart,
a host OOM kill, a bug) or the graded code's (anything it finds that takes its worker down). Counting it
as the machine's would let code cancel its own grade: an episode that ends in an ``InfraError`` is
dropped from training instead of scored, so a policy that crashes its worker whenever it is unsure would
never be pushed away from doing it. So :func:`graded_run`:

1. retries the run once; the failed worker was discarded, so the retry runs on another one;
2. if the retry fails the same way, runs a harmless probe (``pass`` with the same prelude). When the
   probe fails too, the sandbox is broken whatever the code: ``InfraError``, and the episode is dropped;
3. otherwise the failure follows the code: the run counts as failed (``killed_reason="worker_lost"``, every
   test it held fails) and the count of retries is reported with the grade.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from forge_env.errors import InfraError
from forge_env.sandbox import ExecResult, Sandbox

logger = logging.getLogger(__name__)

#: The killed_reason of a run whose code took its sandbox worker down twice in a row.
WORKER_LOST = "worker_lost"
SANDBOX_ERROR = "sandbox_error"
PROBE = "pass\n"


@dataclass
class GradedRun:
    """A grading run's result, and how many times it had to be run again after a sandbox failure."""

    result: ExecResult
    retries: int = 0


async def graded_run(sandbox: Sandbox, code: str, *, stdin: str | bytes | None = None, timeout: float,
                     prelude: str | None = None) -> GradedRun:
    """``sandbox.run`` for grading, with the retry rule of the module docstring."""
    first = await sandbox.run(code, stdin=stdin, timeout=timeout, prelude=prelude)
    if first.killed_reason != SANDBOX_ERROR:
        return GradedRun(first)
    logger.warning("a grading run failed in the sandbox (%s); running it again", first.stderr.strip()[:200])
    second = await sandbox.run(code, stdin=stdin, timeout=timeout, prelude=prelude)
    if second.killed_reason != SANDBOX_ERROR:
        return GradedRun(second, retries=1)
    probe = await sandbox.run(PROBE, timeout=timeout, prelude=prelude)
    if not probe.ok:
        raise InfraError(f"the sandbox fails even a program that does nothing ({probe.killed_reason or probe.exit_code}: "
                         f"{probe.stderr.strip()[:300]}); this grade says nothing about the code")
    logger.warning("graded code took its sandbox worker down twice; it is graded as failed")
    # No stdout: nothing a run that ended this way reported counts.
    return GradedRun(ExecResult(stderr=second.stderr, killed_reason=WORKER_LOST,
                                duration_s=first.duration_s + second.duration_s), retries=1)
