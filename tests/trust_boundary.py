"""The sandbox's tests fail closed: a missing bubblewrap or Docker engine is a failure where it could be there.

The sandbox, grading-forgery, hostile-code and docker modules test the trust boundary. Each is marked with
:func:`requires` (``requires_bwrap`` in tests/sandbox_support.py, ``requires_docker`` in
tests/docker_support.py); where the component is missing, the conftest's set-up hook calls :func:`missing`:

- it is **required** (the test errors, and ``make test`` fails) when ``FORGE_ENV_REQUIRE_BWRAP`` /
  ``FORGE_ENV_REQUIRE_DOCKER`` is ``1``, or, with the variable unset, when this process is root and
  ``apt-get`` is here (``make test`` installs both then, so their absence means the install or the engine
  failed);
- otherwise (not root, no apt-get, or the variable set to ``0`` on purpose) the test skips, and the end of
  the run lists every such skip with its reason (:func:`summary_lines`), so a green run that tested none
  of the trust boundary says so.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter

import pytest

MARK = "trust_boundary"
TAG = "[trust boundary not tested]"  # in a skip's reason
FAIL_TAG = "[trust boundary missing]"  # in a failure's message
COMPONENTS = {
    "bwrap": ("FORGE_ENV_REQUIRE_BWRAP", "make system-deps (apt-get install bubblewrap)"),
    "docker": ("FORGE_ENV_REQUIRE_DOCKER", "make docker-deps and make docker-image (tools/docker_engine.sh)"),
}


def requires(component: str, missing_reason: str | None) -> pytest.MarkDecorator:
    """The mark of a test that needs ``component``; ``missing_reason`` is why it is missing (None: present)."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown trust-boundary component {component!r}; known: {sorted(COMPONENTS)}")
    return getattr(pytest.mark, MARK)(component, missing_reason)


def required(component: str) -> tuple[bool, str]:
    """Whether a missing ``component`` fails the run here, and why."""
    variable, _ = COMPONENTS[component]
    value = os.environ.get(variable, "").strip()
    if value in ("0", "1"):
        return value == "1", f"{variable}={value}"
    if value:
        raise pytest.UsageError(f"{variable} must be 1 (fail without {component}) or 0 (skip), got {value!r}")
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        return True, f"root with apt-get, where `make test` installs it ({variable} unset)"
    return False, f"not root with apt-get ({variable} unset)"


def missing(component: str, reason: str) -> None:
    """Fail (where ``component`` is required) or skip, tagged for the end-of-run summary; never returns."""
    needed, why = required(component)
    variable, install = COMPONENTS[component]
    if needed:
        pytest.fail(f"{FAIL_TAG} {component} is required here ({why}) but {reason}. Install it ({install}), "
                    f"or set {variable}=0 to let these tests skip", pytrace=False)
    pytest.skip(f"{TAG} {component}: {reason}")


def check(item: pytest.Item) -> None:
    """The set-up check of one test: every trust-boundary component it needs is here, or :func:`missing`."""
    for mark in item.iter_markers(MARK):
        component, reason = mark.args
        if reason is not None:
            missing(component, reason)


def summary_lines(stats: dict[str, list]) -> list[str]:
    """The end-of-run report: trust-boundary tests skipped (by reason) and failed for a missing component."""
    skipped: Counter[str] = Counter()
    for report in stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(TAG):
            skipped[reason.removeprefix(TAG).strip()] += 1
    errors: Counter[str] = Counter()
    for report in stats.get("error", []):
        text = str(getattr(report, "longrepr", ""))
        if getattr(report, "when", None) == "setup" and text.startswith(FAIL_TAG):  # what missing() raised
            errors[text.removeprefix(FAIL_TAG).splitlines()[0].strip().split(". Install it")[0]] += 1
    lines = []
    if skipped:
        lines.append(f"{sum(skipped.values())} tests of the sandbox's trust boundary were SKIPPED, not run:")
        lines += [f"  {count:4d} x {reason}" for reason, count in sorted(skipped.items())]
        lines.append("  This run says nothing about the sandbox, grading or docker backend they cover. "
                     "Install the missing component, or run as root with apt-get (`make test` installs them).")
    if errors:
        lines.append(f"{sum(errors.values())} tests of the sandbox's trust boundary FAILED for a missing component:")
        lines += [f"  {count:4d} x {reason}" for reason, count in sorted(errors.items())]
        lines.append("  Install it (" + "; ".join(f"{c}: {install}" for c, (_, install) in COMPONENTS.items())
                     + "), or set " + " / ".join(v for v, _ in COMPONENTS.values()) + "=0 to let them skip.")
    return lines
