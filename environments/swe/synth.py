"""Task synthesis, offline: SWE-bench rows from a local Python repository by injecting bugs.

For a repository whose test suite passes, each candidate mutation (``mutate.py``) is applied to a copy,
the suite runs (host-side, pytest with the report plugin, ``timeout`` seconds per mutant), and the
mutant is kept when some tests fail (``FAIL_TO_PASS``) and others still pass (``PASS_TO_PASS``). The row:

- ``base_commit``: a commit of the mutated tree *without* the test files that hold a failing test,
  made in a mirror (``repos_dir/local__<name>``) whose first commit is the original tree;
- ``test_patch``: adds those test files back (hidden from the agent, applied at grading);
- ``patch``: the inverse of the mutation; ``problem_statement``: the failing tests' names, assertion
  messages and a short traceback (never the fix).

Flaky tests are dropped, as SWE-smith and SWE-Gym validate their tasks: the original suite runs ``runs``
times (default 3) and a test whose outcome varies is never listed; a candidate mutant's suite runs ``runs``
times too, and only tests that fail in every run are ``FAIL_TO_PASS``, only those that pass in every run
``PASS_TO_PASS`` (a correct fix must not earn 0 because a listed test failed by chance at grading). The row
records how many were dropped (``flaky_dropped``; ``validation_runs``).

Candidates are shuffled with ``seed`` (deterministic); commits use fixed identities and dates, so the
same repository, seed and options give the same rows and commit ids. Mutants run on the host: use it on
repositories you trust (their own tests run), as ``pytest`` would.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from environments.swe.mutate import Mutation, mutations
from environments.swe.repos import git, read_tree
from environments.swe.runner import PLUGIN, PYTEST_ARGS
from environments.swe.verdict import PASSED

#: The host-side suite run: the report plugin as a module object (argv[1]), its report's path (argv[2]),
#: pytest's arguments after them.
BOOT = ("import sys, types; sys.path.append('.'); import pytest; plugin = types.ModuleType('forge_swe_report'); "
        "exec(sys.argv[1], plugin.__dict__); plugin._report_path = sys.argv[2]; "
        "sys.exit(pytest.main(sys.argv[3:], plugins=[plugin]))")


class SynthesisError(RuntimeError):
    """The repository cannot be used (no passing test suite, not Python, ...)."""


def run_suite(tree: Path, timeout: float, python: str = sys.executable, *, pytest_plugins: Sequence[str] = (),
              pytest_autoload: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """(status per test id, failure text per failing id) of the repository at ``tree``, run as grading runs
    it (``PYTEST_ARGS``; installed plugins only when ``pytest_autoload`` or named in ``pytest_plugins``);
    a suite that runs past ``timeout`` counts every test it did not report as failed."""
    report = tree.parent / "forge_report.json"
    report.unlink(missing_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tree.parent), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    if not pytest_autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    chosen = [arg for name in pytest_plugins for arg in ("-p", name)]
    try:
        subprocess.run([python, "-I", "-B", "-c", BOOT, PLUGIN, str(report), *PYTEST_ARGS, *chosen], cwd=tree, env=env,
                       timeout=timeout, stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True)
    except subprocess.TimeoutExpired:
        pass
    if not report.exists():
        return {}, {}
    found = json.loads(report.read_text())
    return found["statuses"], found["messages"]


def run_suite_repeatedly(suite: Callable[[Path], tuple[dict[str, str], dict[str, str]]], tree: Path, runs: int,
                         first: tuple[dict[str, str], dict[str, str]] | None = None
                         ) -> tuple[list[str], list[str], list[str], dict[str, str]]:
    """Run ``suite`` on ``tree`` ``runs`` times in all (``first``: a run already made, counted as one) and sort
    the tests by outcome: (passed in every run, failed in every run, varied: flaky, the first run's failure
    messages). A test missing from a run's report failed in it."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    found = [first] if first is not None else []
    while len(found) < runs:
        found.append(suite(tree))
    tests = sorted({test for statuses, _ in found for test in statuses})
    passed = [[statuses.get(test) in PASSED for statuses, _ in found] for test in tests]
    passing = [test for test, outcomes in zip(tests, passed, strict=True) if all(outcomes)]
    failing = [test for test, outcomes in zip(tests, passed, strict=True) if not any(outcomes)]
    flaky = [test for test, outcomes in zip(tests, passed, strict=True) if any(outcomes) and not all(outcomes)]
    return passing, failing, flaky, found[0][1]


def source_files(tree: Path) -> list[str]:
    """Python files that are not tests, setup scripts or configuration."""
    found = []
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree).as_posix()
        parts = rel.split("/")
        if any(p.startswith(".") or p in ("tests", "test", "testing", "docs", "build") for p in parts[:-1]):
            continue
        if parts[-1].startswith("test_") or parts[-1].endswith("_test.py") or parts[-1] in ("conftest.py", "setup.py"):
            continue
        found.append(rel)
    return found


def problem_statement(failing: list[str], messages: dict[str, str], limit: int = 3) -> str:
    """An issue written from the failing tests' output: names, the assertion, a short traceback."""
    lines = [f"After a recent change, {len(failing)} test(s) fail:"]
    lines += [f"- {t}" for t in failing[:10]] + ([f"- ... and {len(failing) - 10} more"] if len(failing) > 10 else [])
    for test in failing[:limit]:
        text = messages.get(test, "")
        errors = [line for line in text.splitlines() if line.startswith("E ")][:6]
        where = [line for line in text.splitlines() if re.match(r"^[\w/.-]+\.py:\d+: ", line)][-2:]
        lines += ["", f"{test}:", "```", *errors, *where, "```"]
    lines += ["", "Find the cause in the source code and fix it; the tests themselves are correct."]
    return "\n".join(lines)


def commit_files(mirror: Path, parent: str, files: dict[str, bytes | None], message: str) -> str:
    """A commit of ``parent``'s tree with ``files`` written (None: removed), made without a checkout."""
    index = mirror / ".git" / f"forge-index-{os.getpid()}"
    env_index = {"GIT_INDEX_FILE": str(index)}
    try:
        _git(mirror, env_index, "read-tree", parent)
        for path, data in sorted(files.items()):
            if data is None:
                _git(mirror, env_index, "update-index", "--force-remove", path)
            else:
                blob = git("hash-object", "-w", "--stdin", cwd=mirror, stdin=data).stdout.decode().strip()
                _git(mirror, env_index, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
        tree = _git(mirror, env_index, "write-tree").strip()
        return git("commit-tree", tree, "-p", parent, "-m", message, cwd=mirror).stdout.decode().strip()
    finally:
        index.unlink(missing_ok=True)


def _git(cwd: Path, extra: dict[str, str], *args: str) -> str:
    from environments.swe.repos import GIT_ENV
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GIT_ENV, **extra}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True, timeout=120)
    return done.stdout.decode()


def _diff(mirror: Path, old: str, new: str) -> str:
    return git("diff", "--no-color", "--no-ext-diff", old, new, cwd=mirror).stdout.decode()


def make_mirror(repo_dir: Path, repos_dir: Path, name: str) -> tuple[Path, str]:
    """``repos_dir/local__<name>``: a fresh git repository whose one commit is ``repo_dir``'s tree."""
    mirror = repos_dir / f"local__{name}"
    if mirror.exists():
        shutil.rmtree(mirror)
    shutil.copytree(repo_dir, mirror, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache"))
    git("init", "-q", "-b", "main", cwd=mirror)
    git("add", "-A", "-f", cwd=mirror)
    git("commit", "-q", "--no-gpg-sign", "-m", f"{name}: original", cwd=mirror)
    return mirror, git("rev-parse", "HEAD", cwd=mirror).stdout.decode().strip()


def synthesize(repo_dir: str | Path, repos_dir: str | Path, *, seed: int = 0, max_tasks: int = 20,
               max_tries: int = 200, timeout: float = 60.0, name: str | None = None,
               progress: bool = True, pytest_plugins: Sequence[str] = (), pytest_autoload: bool = False,
               runs: int = 3) -> list[dict[str, Any]]:
    """SWE-bench rows for ``repo_dir`` (see the module docstring); the mirror goes to ``repos_dir``.
    ``pytest_plugins``/``pytest_autoload``: the installed pytest plugins the suite runs with (as SWE-v0's
    options of the same names, which grading the rows must then be given too). ``runs``: how many times the
    original suite and each candidate's run, to drop flaky tests (1: no validation)."""
    def suite(tree: Path) -> tuple[dict[str, str], dict[str, str]]:
        return run_suite(tree, timeout, pytest_plugins=pytest_plugins, pytest_autoload=pytest_autoload)

    repo_dir = Path(repo_dir).resolve()
    name = name or re.sub(r"[^A-Za-z0-9_.-]", "_", repo_dir.name)
    repos_dir = Path(repos_dir)
    repos_dir.mkdir(parents=True, exist_ok=True)
    mirror, original = make_mirror(repo_dir, repos_dir, name)
    files, _, _ = read_tree(mirror)
    with tempfile.TemporaryDirectory(prefix="forge-swe-synth-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(mirror, work, ignore=shutil.ignore_patterns(".git"))
        stable, broken, flaky, _ = run_suite_repeatedly(suite, work, runs)
        if not stable or broken:
            why = (f"failing: {broken[:5]}" if broken else f"no test passed in all {runs} runs: {flaky[:5]}" if flaky
                   else "no tests ran")
            raise SynthesisError(f"{repo_dir}: the test suite must pass before mutating it; {why}")
        baseline = dict.fromkeys(stable, "passed")  # the flaky ones are never listed
        candidates = [m for path in source_files(work) for m in mutations(path, files[path].decode())]
        random.Random(seed).shuffle(candidates)
        rows: list[dict[str, Any]] = []
        for mutation in _bar(candidates[:max_tries], progress, f"synth {name}"):
            if len(rows) >= max_tasks:
                break
            row = _try(mutation, work, files, baseline, suite, mirror, original, name, runs)
            if row is not None:
                row["flaky_dropped"] += len(flaky)
                rows.append(row)
    return rows


def _try(mutation: Mutation, work: Path, files: dict[str, bytes], baseline: dict[str, str], suite: Callable[[Path], Any],
         mirror: Path, original: str, name: str, runs: int = 1) -> dict[str, Any] | None:
    source = files[mutation.path].decode()
    mutated = mutation.apply(source)
    if mutated == source:
        return None
    target = work / mutation.path
    try:
        target.write_text(mutated)
        first = suite(work)
        if not all(_split(first[0], baseline)):
            return None  # not a candidate (no test fails, or none passes): one run says so
        passed, failed, varied, messages = run_suite_repeatedly(suite, work, runs, first)
    finally:
        target.write_text(source)
    # a test the original passes every time; one missing from the mutant's reports failed there
    failing = sorted(t for t in baseline if t in failed or (t not in passed and t not in varied))
    passing = sorted(t for t in baseline if t in passed)
    dropped = sum(t in varied for t in baseline)
    if not failing or not passing:
        return None
    test_files = sorted({t.split("::")[0] for t in failing})
    buggy = commit_files(mirror, original, {mutation.path: mutated.encode()}, "mutant")
    base = commit_files(mirror, buggy, dict.fromkeys(test_files), f"{name}: {mutation.kind} at {mutation.path}:{mutation.line}")
    git("update-ref", f"refs/tasks/{base}", base, cwd=mirror)
    return {"instance_id": f"{name}__{mutation.kind}-{base[:8]}", "repo": f"local/{name}", "base_commit": base,
            "problem_statement": problem_statement(failing, messages), "patch": _diff(mirror, buggy, original), "test_patch": _diff(mirror, base, buggy),
            "FAIL_TO_PASS": failing, "PASS_TO_PASS": passing, "test_cmd": "pytest", "repo_path": str(mirror.resolve()),
            "mutation": {"kind": mutation.kind, "path": mutation.path, "line": mutation.line},
            "flaky_dropped": dropped, "validation_runs": runs}


def _split(statuses: dict[str, str], baseline: dict[str, str]) -> tuple[list[str], list[str]]:
    """(failing, passing) of the baseline's tests in one run."""
    failing = [t for t in baseline if statuses.get(t) not in PASSED]
    return failing, [t for t in baseline if t not in failing]


def _bar(items: list[Mutation], enabled: bool, label: str) -> Iterable[Mutation]:
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=label, unit="mutant", file=sys.stderr)


def write_rows(rows: list[dict[str, Any]], out: str | Path) -> None:
    Path(out).write_text("".join(json.dumps(row) + "\n" for row in rows))
