"""Suite-wide hooks: the trust boundary's tests fail closed (see tests/trust_boundary.py)."""

from __future__ import annotations

import pytest

from tests import trust_boundary


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{trust_boundary.MARK}(component, missing_reason): needs bubblewrap or "
                            "a Docker engine; fails where it could be installed, else skips and is reported")


def pytest_runtest_setup(item: pytest.Item) -> None:
    trust_boundary.check(item)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    lines = trust_boundary.summary_lines(terminalreporter.stats)
    if lines:
        terminalreporter.section("trust boundary", sep="!", red=True, bold=True)
        for line in lines:
            terminalreporter.line(line, red=True, bold=True)
