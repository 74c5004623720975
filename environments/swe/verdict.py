"""From per-test statuses to SWE-bench's resolution, by the ``swebench`` package's own grading functions.

A :class:`Resolution` (which graded tests passed, whether the task is resolved) is an input to SWE-v0's
:class:`~forge_env.core.verdict.Verdict` (``SWEEnv.grade_episode``), not a grading result of its own.

The statuses come from our report plugin (``runner.py``), never from printed test output. They are
mapped to ``swebench.harness.constants.TestStatus`` values and handed to
``swebench.harness.grading.get_eval_tests_report`` (which sorts each ``FAIL_TO_PASS`` / ``PASS_TO_PASS``
id into success or failure) and ``get_resolution_status`` (``RESOLVED_FULL`` is SWE-bench's *resolved*).

One deliberate difference: swebench counts a *skipped* ``PASS_TO_PASS`` test as maintained. Code under
test can make any test skip (``raise unittest.SkipTest`` or ``pytest.skip()`` from the function the test
calls), so a skip would hide every regression; we map ``skipped`` to ``FAILED`` before swebench sees it.
An ``xfail`` counts as passed (as in swebench) only for a test whose function or class carries an
``xfail`` marker; an imperative ``pytest.xfail()``, or a module-wide ``pytestmark`` (code under test can
set both: the latter on the test module that imports it), is ``xfail-imperative`` and fails.

Without the ``swebench`` package (it is in the ``dev`` extra) the same rule is computed here; a test
(``tests/test_swe_verdict.py``) checks that both agree on every combination of statuses.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

#: Our statuses that count as passed (both lists), and their swebench names.
PASSED = frozenset({"passed", "xfail"})
TO_SWEBENCH = {"passed": "PASSED", "xfail": "XFAIL", "failed": "FAILED", "error": "ERROR",
               "skipped": "FAILED", "xpass": "FAILED", "xfail-imperative": "FAILED"}


@dataclass(frozen=True)
class Resolution:
    """Which graded tests passed, and whether that resolves the task (swebench's ``get_resolution_status``)."""

    fail_to_pass_passed: int
    pass_to_pass_passed: int
    resolved: bool
    by: str  # "swebench <version>" or "forge-env"


@functools.lru_cache(maxsize=1)
def swebench_grading() -> Any:
    """``swebench.harness.grading`` (imported once: it imports docker's client), or None when not installed."""
    try:
        from swebench.harness import grading
    except ImportError:
        return None
    return grading


def status_map(statuses: dict[str, str]) -> dict[str, str]:
    """Our statuses as swebench's ``TestStatus`` values; ids without a report (``missing``) are left out."""
    return {test: TO_SWEBENCH.get(status, "FAILED") for test, status in statuses.items() if status != "missing"}


def swebench_report(statuses: dict[str, str], fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...]
                    ) -> dict[str, dict[str, list[str]]] | None:
    """swebench's ``get_eval_tests_report`` for these statuses (None without the package)."""
    grading = swebench_grading()
    if grading is None:
        return None
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS

    return grading.get_eval_tests_report(status_map(statuses),
                                         {FAIL_TO_PASS: list(fail_to_pass), PASS_TO_PASS: list(pass_to_pass)})


def verdict(statuses: dict[str, str], fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...]) -> Resolution:
    """The verdict for these statuses (see the module docstring)."""
    report = swebench_report(statuses, fail_to_pass, pass_to_pass)
    if report is None:
        f2p = sum(statuses.get(t) in PASSED for t in fail_to_pass)
        p2p = sum(statuses.get(t) in PASSED for t in pass_to_pass)
        return Resolution(f2p, p2p, f2p == len(fail_to_pass) and p2p == len(pass_to_pass), "forge-env")
    import swebench
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus

    resolved = swebench_grading().get_resolution_status(report) == ResolvedStatus.FULL.value
    return Resolution(len(report[FAIL_TO_PASS]["success"]), len(report[PASS_TO_PASS]["success"]), resolved,
                   f"swebench {swebench.__version__}")
