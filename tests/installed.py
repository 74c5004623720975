"""Packages `make test` installs are required, never skipped on: a broken install fails the suite."""

from __future__ import annotations

import importlib.util


def require(*modules: str) -> None:
    """Raise ImportError (failing the test module at collection) for any of ``modules`` that is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"{', '.join(missing)} not installed: `make install` installs it (pyproject.toml extras); "
                          f"the tests that need it fail instead of skipping")
