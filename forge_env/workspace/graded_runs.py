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

:func:`retry_machine_failure` is that rule for any grading step (Terminal-v0's verifier container runs
under it too); :func:`graded_run` is it for one ``sandbox.run``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from forge_env.errors import InfraError
from forge_env.sandbox import ExecResult, Sandbox

logger = logging.getLogger(__name__)

#: The killed_reason of a run whose code took its sandbox worker down twice in a row.
WORKER_LOST = "worker_lost"
SANDBOX_ERROR = "sandbox_error"
PROBE = "pass\n"
T = TypeVar("T")


@dataclass
class Retried(Generic[T]):
    """What :func:`retry_machine_failure` found: the attempt that counts, how many attempts were run again,
    and whether both attempts failed while the machine passed the probe (``lost``: the code's failure)."""

    result: T
    retries: int = 0
    lost: bool = False
    attempts: tuple[T, ...] = ()


async def retry_machine_failure(attempt: Callable[[], Awaitable[T]], failure: Callable[[T], str | None],
                                probe: Callable[[], Awaitable[str | None]], *, what: str = "a grading run"
                                ) -> Retried[T]:
    """The rule of the module docstring, for any grading step: ``attempt()`` runs it afresh (a fresh worker,
    container...), ``failure(result)`` says why a result is a sandbox failure (None: a result to grade),
    ``probe()`` runs something harmless the same way and says why it failed (None: the machine works).

    One failure: run again, and the retry counts. Two: the probe decides. A failing probe is the machine's:
    ``InfraError`` (the episode is dropped). A passing one puts the failure on what was graded: the second
    result comes back with ``lost=True``, for the caller to grade as failed."""
    first = await attempt()
    why = failure(first)
    if why is None:
        return Retried(first, attempts=(first,))
    logger.warning("%s failed in the sandbox (%s); running it again", what, why[:200])
    second = await attempt()
    if failure(second) is None:
        return Retried(second, retries=1, attempts=(first, second))
    broken = await probe()
    if broken is not None:
        raise InfraError(f"the sandbox fails even a program that does nothing ({broken[:300]}); "
                         f"{what} says nothing about the work")
    logger.warning("%s took its sandbox down twice; it is graded as failed", what)
    return Retried(second, retries=1, lost=True, attempts=(first, second))


@dataclass
class GradedRun:
    """A grading run's result, and how many times it had to be run again after a sandbox failure."""

    result: ExecResult
    retries: int = 0


async def graded_run(sandbox: Sandbox, code: str, *, stdin: str | bytes | None = None, timeout: float,
                     prelude: str | None = None) -> GradedRun:
    """``sandbox.run`` for grading, with the retry rule of the module docstring."""
    async def attempt() -> ExecResult:
        return await sandbox.run(code, stdin=stdin, timeout=timeout, prelude=prelude)

    async def probe() -> str | None:
        result = await sandbox.run(PROBE, timeout=timeout, prelude=prelude)
        return None if result.ok else f"{result.killed_reason or result.exit_code}: {result.stderr.strip()}"

    found = await retry_machine_failure(
        attempt, lambda r: (r.stderr.strip() or SANDBOX_ERROR) if r.killed_reason == SANDBOX_ERROR else None, probe)
    if not found.lost:
        return GradedRun(found.result, retries=found.retries)
    first, second = found.attempts
    # No stdout: nothing a run that ended this way reported counts.
    return GradedRun(ExecResult(stderr=second.stderr, killed_reason=WORKER_LOST,
                                duration_s=first.duration_s + second.duration_s), retries=1)
