"""The lean interpreter's own defences (forge_env/sandbox/interpreter.py), from the red team of issue 42.

- A cached interpreter is checked against what it must hold before each use: a planted ``.pth`` file or
  module (graded code in a non-root ``rlimits`` sandbox runs as the caller and could write the cache) is
  found, nothing of it runs on the host, and the interpreter is rebuilt.
- The allow-list resolves only from this environment's site-packages: an editable install (the project
  itself, whose tree holds the bundled tasks) and a name that is not installed are refused.
- The caller's own directories are masked where they fall inside a bound directory (a project under /usr).
- Once bubblewrap has worked in a process, a failed worker start is an error, never a silent fallback to
  rlimits (which graded code could provoke to read the host's files).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import uuid
from pathlib import Path

import pytest

import forge_env.sandbox.process as process_module
from forge_env.sandbox import make_sandbox
from forge_env.sandbox.base import SandboxUnavailableError
from forge_env.sandbox.bwrap import python_roots
from forge_env.sandbox.interpreter import CACHE_ENV, SandboxPackageError, lean_python
from tests.sandbox_support import requires_bwrap


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    return cache


def test_a_planted_pth_file_is_found_never_run_on_the_host_and_the_interpreter_rebuilt(private_cache, tmp_path):
    python = Path(lean_python())
    root = python.parent.parent
    site = next(root.glob("lib/python*/site-packages"))
    marker = tmp_path / "ran-on-host"
    (site / "zz_planted.pth").write_text(f"import os; open({str(marker)!r}, 'w').write('host')\n")
    python_roots.cache_clear()
    assert python_roots(str(python)) and not marker.exists()  # the host-side probe runs no .pth file
    again = Path(lean_python())
    assert again == python and not (site / "zz_planted.pth").exists() and not marker.exists()
    # A changed file of an allowed package is found the same way.
    with_pytest = Path(lean_python(["pytest"]))
    module = next(with_pytest.parent.parent.glob("lib/python*/site-packages/pytest/__init__.py"))
    module.write_text(module.read_text() + "\nLEAKED = True\n")
    rebuilt = Path(lean_python(["pytest"]))
    assert "LEAKED" not in next(rebuilt.parent.parent.glob("lib/python*/site-packages/pytest/__init__.py")).read_text()


def test_the_allow_list_takes_only_normally_installed_packages(private_cache):
    with pytest.raises(SandboxPackageError, match="editable"):
        lean_python(["forge-env"])  # the project itself: an editable install whose tree holds task data
    with pytest.raises(SandboxPackageError, match="not installed"):
        lean_python(["no-such-package-" + uuid.uuid4().hex[:6]])


@requires_bwrap
def test_the_callers_own_directories_are_masked_inside_bound_ones(monkeypatch):
    """A project under /usr (where the sandbox binds the system) is the caller's sys.path entry: masked."""
    project = Path("/usr/local/src") / f"forge-rt-{uuid.uuid4().hex[:8]}"
    project.mkdir(parents=True)
    try:
        (project / "tasks.jsonl").write_text('{"solution": "the answer key"}\n')
        os.chmod(project, 0o755)
        os.chmod(project / "tasks.jsonl", 0o644)
        monkeypatch.setattr(sys, "path", [*sys.path, str(project)])

        async def read() -> str:
            async with make_sandbox("process", isolation="bwrap", max_concurrency=1) as sandbox:
                result = await sandbox.run(f"import os\nprint(os.listdir({str(project)!r}))")
                return result.stdout.strip()

        assert asyncio.run(read()) == "[]"
    finally:
        shutil.rmtree(project, ignore_errors=True)


@requires_bwrap
def test_no_fallback_to_rlimits_once_bubblewrap_has_worked(monkeypatch):
    async def scenario() -> None:
        sandbox = make_sandbox("process", max_concurrency=1)  # isolation "auto"
        try:
            assert sandbox.isolation == "bwrap"
            assert (await sandbox.run("print(1)")).stdout == "1\n"

            def broken(*args, **kwargs):
                raise SandboxUnavailableError("provoked: bubblewrap could not start")

            monkeypatch.setattr(process_module, "bwrap_launch", broken)
            for pid in sandbox.worker_pids:  # the worker goes down (as a run could provoke): a respawn follows
                os.kill(pid, signal.SIGKILL)
            outcomes: list[object] = []
            for _ in range(3):  # the dead worker may first be found by a run (an error result), then replaced
                try:
                    outcomes.append((await sandbox.run("print('ran')")).stdout == "ran\n")
                except SandboxUnavailableError:
                    outcomes.append("raised")
            assert True not in outcomes and "raised" in outcomes, outcomes
            assert sandbox.isolation == "bwrap"
            assert make_sandbox("process").isolation == "bwrap"  # nor does a new "auto" sandbox fall back
        finally:
            await sandbox.close()

    asyncio.run(scenario())
