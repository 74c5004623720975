"""The bundled SWE-v0 tasks: bugs synthesised (``synth.py``) in ``bundled/tinylib``, a small repository
written for forge-env, so that SWE-v0 runs on a fresh machine with nothing fetched.

A git repository cannot ship inside a package, so the mirror is rebuilt on first use, deterministically
(fixed identities and dates), under ``$XDG_CACHE_HOME/forge-env/swe`` and every row's ``base_commit`` is
checked against it. The bundled tree is the *fixed* code: it is hidden from every sandbox
(``hide_from_sandboxes``), as the task file is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from forge_env.sandbox import hide_from_sandboxes

BUNDLED = Path(__file__).with_name("bundled")
TREE = BUNDLED / "tinylib"
TASKS = BUNDLED / "tasks.jsonl"
NAME = "tinylib"
_lock = threading.Lock()


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "forge-env" / "swe"


def bundled_rows() -> list[dict[str, Any]]:
    hide_from_sandboxes(TASKS)
    hide_from_sandboxes(TREE)
    return [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]


def bundled_tasks() -> tuple[list[dict[str, Any]], Path]:
    """(the bundled rows, the repos_dir holding their mirror), building the mirror on first use."""
    rows = bundled_rows()
    digest = hashlib.sha256(TASKS.read_bytes()).hexdigest()[:12]
    repos = cache_dir() / digest
    with _lock:
        if not (repos / f"local__{NAME}" / ".git").is_dir():
            build_mirror(rows, repos)
    return rows, repos


def build_mirror(rows: list[dict[str, Any]], repos: Path) -> None:
    """Rebuild ``repos/local__tinylib`` with every row's commits; error when one comes out different."""
    from environments.swe.synth import commit_files, make_mirror

    repos.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="forge-swe-bundled-", dir=repos.parent))
    try:
        mirror, original = make_mirror(TREE, staging, NAME)
        for row in rows:
            mutation = row["mutation"]
            source = (TREE / mutation["path"]).read_text()
            with tempfile.TemporaryDirectory() as tmp:
                target = Path(tmp) / mutation["path"]
                target.parent.mkdir(parents=True)
                target.write_text(source)
                subprocess.run(["git", "apply", "-R", "-"], cwd=tmp, input=row["patch"].encode(), check=True,
                               capture_output=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
                mutated = target.read_bytes()
            buggy = commit_files(mirror, original, {mutation["path"]: mutated}, "mutant")
            test_files = sorted({t.split("::")[0] for t in row["FAIL_TO_PASS"]})
            base = commit_files(mirror, buggy, dict.fromkeys(test_files),
                           f"{NAME}: {mutation['kind']} at {mutation['path']}:{mutation['line']}")
            if base != row["base_commit"]:
                raise RuntimeError(f"bundled SWE task {row['instance_id']}: rebuilt base commit {base} differs "
                                   f"from {row['base_commit']} (git changed its object format?)")
            subprocess.run(["git", "update-ref", f"refs/tasks/{base}", base], cwd=mirror, check=True)
        if repos.exists():
            shutil.rmtree(repos)
        os.replace(staging, repos)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def regenerate(seed: int = 0, max_tasks: int = 12, max_tries: int = 80) -> list[dict[str, Any]]:
    """Synthesise the bundled task file again (maintainers: after editing ``bundled/tinylib``)."""
    from environments.swe.synth import synthesize, write_rows

    with tempfile.TemporaryDirectory() as tmp:
        rows = synthesize(TREE, tmp, seed=seed, max_tasks=max_tasks, max_tries=max_tries, name=NAME)
    for row in rows:
        row.pop("repo_path")  # the mirror is rebuilt under the cache directory
    write_rows(rows, TASKS)
    return rows
