"""Synthesis and grading against a real repository's own test suite, written by nobody here.

The ``referencing`` package (MIT, Julian Berman; a dependency of ``jsonschema``) ships its test suite in
its wheel. The test builds a repository from the installed package's files as they are (minus
``test_referencing_suite.py``, which needs the upstream JSON suite the wheel does not ship), runs
``environments.swe.synth.synthesize`` on it (a few mutants, bounded) and plays every produced task
through the real SWE-v0 env on the process backend: its own ``patch`` (``git apply`` from the shell, as a
model would) resolves it, the empty patch does not. Nothing is fetched.

The repository's copy of ``referencing`` is the one its tests import (pytest puts the rootdir of a test
package first on ``sys.path``), which the mutants failing its tests show.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from pathlib import Path

import pytest

from environments.swe import SWEEnv
from environments.swe.synth import synthesize
from tests.swe_support import call, play, swe_sandbox

referencing = pytest.importorskip("referencing", reason="the referencing package (via jsonschema) is not installed")


def build_repository(root: Path) -> Path:
    """A repository of the installed ``referencing`` package, its own tests included."""
    source = Path(referencing.__file__).parent
    assert (source / "tests" / "test_core.py").is_file(), "this referencing wheel ships no tests"
    shutil.copytree(source, root / "referencing",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "test_referencing_suite.py"))
    (root / "README.md").write_text(f"referencing {importlib.metadata.version('referencing')}, from its wheel\n")
    return root


@pytest.fixture(scope="module")
def sandbox():
    # The repository's own dependencies, as a task set declares them: the sandbox's interpreter holds only
    # the standard library, pytest and what is allow-listed (forge_env/sandbox/interpreter.py).
    needs = [re.match(r"[A-Za-z0-9._-]+", r).group(0) for r in importlib.metadata.requires("referencing") or ()
             if "extra" not in r]
    yield from swe_sandbox("process", tuple(needs))


async def test_tasks_synthesised_from_a_real_repositorys_own_suite_are_solved_by_their_patch_only(tmp_path, sandbox):
    repo = build_repository(tmp_path / "referencing")
    repos = tmp_path / "repos"
    rows = synthesize(repo, repos, seed=0, max_tasks=3, max_tries=12, timeout=60, progress=False)
    assert rows, "no mutant of referencing was kept"
    for row in rows:
        assert row["mutation"]["path"].startswith("referencing/") and "/tests/" not in row["mutation"]["path"]
        assert row["FAIL_TO_PASS"] and len(row["PASS_TO_PASS"]) > 100  # the suite has ~200 tests
        assert all(t.startswith("referencing/tests/") for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"])
    env = SWEEnv(rows, repos_dir=repos, sandbox=sandbox, grading_timeout=120, bash_timeout=30)
    try:
        for row in rows:
            apply = call("bash", command=f"git apply - <<'FORGE_PATCH_END'\n{row['patch']}FORGE_PATCH_END\n"
                                         "git diff --stat")
            reward, info, outputs = await play(env, row, apply)
            summary = info["episode_summary"]
            assert "1 file changed" in outputs[0], (row["instance_id"], outputs[0])
            assert reward == 1.0 and summary["resolved"] is True, (row["instance_id"], summary)
            reward, info, _ = await play(env, row)
            summary = info["episode_summary"]
            assert reward == 0.0 and summary["fail_to_pass"] == f"0/{len(row['FAIL_TO_PASS'])}", (row["instance_id"],
                                                                                                   summary)
            assert summary["pass_to_pass"] == f"{len(row['PASS_TO_PASS'])}/{len(row['PASS_TO_PASS'])}"
    finally:
        await env.aclose()
