"""Grading: the agent's changes minus test infrastructure, with ``test_patch``, in a fresh sandbox run.

1. The workspace's snapshot (every file whose content differs from ``base_commit``) is untrusted input.
   Changes to test infrastructure are dropped and reported (:func:`split_changes`): the files
   ``test_patch`` touches, the files holding graded tests, every file in a test directory (``tests/``,
   ``test/``, ``testing/``: helpers the tests compare with) and test module (``test_*.py``), any ``conftest.py``,
   every file pytest reads its configuration from by name (:data:`INFRA_NAMES`), ``setup.cfg``/``pyproject.toml``
   when their pytest section changes, ``sitecustomize.py``/``usercustomize.py``, ``*.pth``, bytecode
   (``*.pyc``, ``__pycache__``), paths that leave the tree and names no file can have (a NUL byte: the
   snapshot's reply can be forged, see ``forge_env.workspace.workspace.snapshot_of``). Symlinks and special files are never carried.
2. The rest is laid over the base tree with ``test_patch`` applied (built on the host, ``repos.py``) and
   sent to a pool run (never the agent's session worker) as a tar on stdin.
3. ``runner.py`` runs pytest there on the ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` ids and reads each test's
   status from a report plugin's JSON (not from the exit code or printed text).
4. A canary test (``canary.py``) is appended to each graded test module and run too: one that passes
   shows the code under test forged the outcomes (patched pytest), and the grade is 0 (``tampered``).
5. A run whose worker dies is retried once; if it dies again the tests count as failed
   (``forge_env.workspace.graded_run``: the code under test cannot cancel its own grade).
"""

from __future__ import annotations

import configparser
import json
import posixpath
import tarfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from environments.swe.canary import add_canaries, forged_canaries
from environments.swe.repos import BaseCheckout
from environments.swe.runner import PRELUDE, RUNNER
from environments.swe.tasks import SWETask
from environments.swe.verdict import PASSED, Resolution, verdict
from forge_env.sandbox import Sandbox
from forge_env.workspace import Snapshot, graded_run

#: Files dropped by name wherever they are: conftest.py, start-up hooks, and every file pytest reads its
#: configuration from by name alone (pytest 9: ``pytest.toml``, ``.pytest.toml``, ``pytest.ini``,
#: ``.pytest.ini``, ``tox.ini``; ``setup.cfg`` and ``pyproject.toml`` count only when their section changes).
INFRA_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
                         "sitecustomize.py", "usercustomize.py"})


def _ini_sections(text: str) -> Any:
    """The pytest sections of a setup.cfg as pytest's own INI parser (``iniconfig``) reads them, or None
    where it is not installed here."""
    try:
        import iniconfig
    except ImportError:
        return None
    try:
        parsed = iniconfig.IniConfig("setup.cfg", data=text)
    except Exception:  # iniconfig.ParseError; pytest then fails to start, which costs the agent only
        return "unreadable"
    return {s: dict(parsed[s].items()) for s in ("tool:pytest", "pytest") if s in parsed.sections} or None


def _pytest_section(path: str, data: bytes | None) -> Any:
    """The pytest configuration a setup.cfg/pyproject.toml holds (``"unreadable"`` when it cannot be read).
    A setup.cfg is read twice: by ``configparser`` over the lines ``str.splitlines`` finds (pytest's INI
    parser also breaks lines at a lone ``\\r``, ``\\x0b``, ``\\x1c``, ``\\x85``, ``\\u2028``..., where
    configparser does not: a section hidden behind one of those was invisible to it), and by ``iniconfig``."""
    if data is None:
        return None
    try:
        if path.endswith("pyproject.toml"):
            return tomllib.loads(data.decode()).get("tool", {}).get("pytest")
        text = data.decode()
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string("\n".join(text.splitlines()) + "\n")
        found = {s: dict(parser[s]) for s in ("tool:pytest", "pytest") if parser.has_section(s)} or None
        seen = (found, _ini_sections(text))
        return None if seen == (None, None) else seen
    except (UnicodeDecodeError, ValueError, configparser.Error, tomllib.TOMLDecodeError):
        return "unreadable"


TEST_DIRS = frozenset({"tests", "test", "testing"})


def _plain_name(path: str) -> bool:
    """Whether ``path`` can be a file's name as the tar carries it. The snapshot is untrusted down to its
    paths (the agent's processes can forge the workspace's reply, see ``forge_env.workspace.workspace.snapshot_of``): GNU tar
    cuts a name at a NUL (``conftest.py\\0.txt`` was unpacked as ``conftest.py``, past every drop rule),
    and a lone surrogate cannot be encoded at all (grading raised)."""
    if "\0" in path:
        return False
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def infra_reason(path: str, new: bytes | None, checkout: BaseCheckout,
                 graded_files: frozenset[str] = frozenset()) -> str | None:
    """Why a change to ``path`` (new content, None: deleted) is test infrastructure, or None when it is not.
    ``graded_files``: the files holding the graded tests (``FAIL_TO_PASS``/``PASS_TO_PASS``)."""
    if not _plain_name(path):
        return "not a file name (a NUL byte, or not encodable)"
    normal = posixpath.normpath(path)
    if normal in (".", "") or normal.startswith("../") or normal == ".." or posixpath.isabs(normal) \
            or normal == ".git" or normal.startswith(".git/"):
        return "outside the tree"
    name = posixpath.basename(normal)
    if normal in checkout.test_paths:
        return "a file the hidden tests touch"
    if normal in graded_files:
        return "a file holding graded tests"
    if name == "__init__.py" and TEST_DIRS & set(normal.split("/")[:-1]):
        return "a test package's __init__.py"
    if name in INFRA_NAMES:
        return f"test infrastructure ({name})"
    if name.endswith(".pth"):
        return "a .pth file"
    if name.endswith((".pyc", ".pyo")) or "__pycache__" in normal.split("/"):
        return "bytecode"
    # Test helpers (``tests/helpers.py``: what a graded test compares with) are test infrastructure too.
    # No reference fix touches them: SWE-bench puts every path with "test" in it into test_patch, never
    # into patch, and synthesis (synth.py) mutates no file in a test directory and no test_*.py.
    if TEST_DIRS & set(normal.split("/")[:-1]):
        return "a file in a test directory"
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return "a test module"
    if "." in name and name.split(".", 1)[0] in TEST_DIRS:  # tests.py or tests.*.so: a test package's name
        return "a module named like a test package"  # (it shadows a tests/ without __init__.py)
    if name in ("setup.cfg", "pyproject.toml"):
        if _pytest_section(normal, new) != _pytest_section(normal, checkout.files.get(normal)):
            return f"the pytest section of {name}"
    return None


def split_changes(snapshot: Snapshot, checkout: BaseCheckout, tests: tuple[str, ...] = ()
                  ) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """(kept changes: path -> content or None for a deletion, dropped: path -> reason); ``tests``: the
    graded test ids, whose files are never changed."""
    graded_files = frozenset(posixpath.normpath(t.split("::")[0]) for t in tests)
    kept: dict[str, bytes | None] = {}
    dropped: dict[str, str] = {}
    for path, data in [*snapshot.changed.items(), *((p, None) for p in snapshot.deleted)]:
        reason = infra_reason(path, data, checkout, graded_files)
        if reason is None and data is None and path in checkout.links:
            reason = "a symlink of the base tree"
        if reason:
            dropped[path] = reason
        else:
            kept[posixpath.normpath(path)] = data
    dropped.update({p: "a symlink or special file" for p in snapshot.odd})
    dropped.update({p: "too large" for p in snapshot.too_big})
    return kept, dropped


def _member(path: str, data: bytes, mode: int) -> bytes:
    """One regular file as tar bytes (header, data, padding), as ``tarfile`` writes it."""
    info = tarfile.TarInfo("repo/" + path)
    info.size = len(data)
    info.mode = mode
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + bytes(-len(data) % tarfile.BLOCKSIZE)


def _test_tree_members(checkout: BaseCheckout) -> dict[str, bytes]:
    """Every file of the test tree as tar bytes, built once per checkout (grading a 1,000-file tree then
    costs a join, not 1,000 headers)."""
    found = checkout.__dict__.get("_tar_members")
    if found is None:
        found = {p: _member(p, d, checkout.modes.get(p, 0o644)) for p, d in checkout.test_tree.items()}
        object.__setattr__(checkout, "_tar_members", found)
    return found


def graded_tree(checkout: BaseCheckout, kept: dict[str, bytes | None], dropped: dict[str, str]) -> bytes:
    """A tar of the test tree with the kept changes laid over it (conflicting paths are dropped)."""
    return tree_tar(checkout, laid_tree(checkout, kept, dropped))


def laid_tree(checkout: BaseCheckout, kept: dict[str, bytes | None], dropped: dict[str, str]) -> dict[str, bytes]:
    """The test tree with the kept changes laid over it (a copy; conflicting paths are dropped)."""
    tree = dict(checkout.test_tree)
    for path, data in kept.items():
        if data is None:
            tree.pop(path, None)
        else:
            tree[path] = data
    directories = {posixpath.dirname(p) for p in tree} | set(checkout.links)
    parents = {"/".join(p.split("/")[:i]) for p in directories for i in range(1, p.count("/") + 2)}
    for path in [p for p in tree if p in parents]:
        dropped[path] = "a file where the tree needs a directory"
        del tree[path]
    return tree


def tree_tar(checkout: BaseCheckout, tree: dict[str, bytes]) -> bytes:
    """A tar of ``tree`` (files of the checkout's test tree reuse their cached tar bytes) and its symlinks."""
    cached = _test_tree_members(checkout)
    chunks = [cached[path] if checkout.test_tree.get(path) is data else
              _member(path, data, checkout.modes.get(path, 0o644)) for path, data in sorted(tree.items())]
    for path, target in checkout.links.items():
        info = tarfile.TarInfo("repo/" + path)
        info.type = tarfile.SYMTYPE
        info.linkname = target
        chunks.append(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
    chunks.append(bytes(2 * tarfile.BLOCKSIZE))  # the end of the archive
    size = sum(map(len, chunks))
    chunks.append(bytes(-size % tarfile.RECORDSIZE))
    return b"".join(chunks)


@dataclass
class Grade:
    """What the grading run found: per-test statuses, their resolution, and what was dropped. The record a
    :class:`~forge_env.core.verdict.Verdict` is made from (``SWEEnv.grade_episode``), not a verdict itself."""

    statuses: dict[str, str]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    dropped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    retries: int = 0
    worker_lost: bool = False
    output_tail: str = ""
    workspace_lost: str | None = None
    canaries: dict[str, str] = field(default_factory=dict)  # canary node id -> module (canary.py)
    canaries_skipped: dict[str, str] = field(default_factory=dict)  # module -> why it has no canary

    @property
    def tampered(self) -> list[str]:
        """The canaries whose status shows the run's outcomes were forged (then the grade is 0)."""
        return forged_canaries(self.statuses, self.canaries, self.fail_to_pass + self.pass_to_pass)

    def passed(self, tests: tuple[str, ...]) -> int:
        return sum(self.statuses.get(t) in PASSED for t in tests)

    @property
    def resolution(self) -> Resolution:
        """swebench's resolution of these statuses (``verdict.py``)."""
        return verdict(self.statuses, self.fail_to_pass, self.pass_to_pass)

    @property
    def resolved(self) -> bool:
        return self.resolution.resolved and not self.tampered

    @property
    def fraction(self) -> float:
        total = len(self.fail_to_pass) + len(self.pass_to_pass)
        if self.tampered:
            return 0.0
        found = self.resolution
        return (found.fail_to_pass_passed + found.pass_to_pass_passed) / total if total else 0.0

    def summary(self) -> dict[str, Any]:
        found = self.resolution
        forged = self.tampered
        return {"resolved": found.resolved and not forged,
                "fail_to_pass": f"{found.fail_to_pass_passed}/{len(self.fail_to_pass)}",
                "pass_to_pass": f"{found.pass_to_pass_passed}/{len(self.pass_to_pass)}", "verdict_by": found.by,
                "dropped": dict(sorted(self.dropped.items())),
                "grading_retries": self.retries, "worker_lost": self.worker_lost,
                **({"workspace_lost": self.workspace_lost} if self.workspace_lost else {}),
                **({"tampered": True, "tampered_canaries": forged} if forged else {}),
                **({"canaries_skipped": dict(self.canaries_skipped)} if self.canaries_skipped else {})}


async def grade(sandbox: Sandbox, task: SWETask, checkout: BaseCheckout, snapshot: Snapshot, *,
                timeout: float = 300.0, pytest_plugins: Sequence[str] = (), pytest_autoload: bool = False) -> Grade:
    """Grade a snapshot (see the module docstring). InfraError only when the sandbox fails a no-op too.
    ``pytest_plugins``: installed plugins to load (``-p NAME``); ``pytest_autoload``: load every installed
    one, as a bare ``pytest`` does (off by default: each costs its import, rewritten from source, per run)."""
    started = time.monotonic()
    kept, dropped = split_changes(snapshot, checkout, task.fail_to_pass + task.pass_to_pass)
    tree = laid_tree(checkout, kept, dropped)
    canaries, canaries_skipped = add_canaries(tree, task.fail_to_pass + task.pass_to_pass)
    payload = tree_tar(checkout, tree)
    tests = list(dict.fromkeys(task.fail_to_pass + task.pass_to_pass)) + list(canaries)
    spec = {"tests": tests, "timeout": timeout, "autoload": bool(pytest_autoload), "plugins": list(pytest_plugins)}
    stdin = json.dumps(spec).encode() + b"\n" + payload
    run = await graded_run(sandbox, RUNNER, stdin=stdin, timeout=timeout + 30, prelude=PRELUDE)
    statuses: dict[str, str] = {}
    tail = run.result.stderr[-2000:]
    lines = run.result.stdout.rstrip("\n").rsplit("\n", 1)
    try:
        report = json.loads(lines[-1]) if run.result.killed_reason is None else {}
    except json.JSONDecodeError:
        report = {}
    if isinstance(report, dict) and isinstance(report.get("statuses"), dict):
        statuses = {str(k): str(v) for k, v in report["statuses"].items()}
        tail = str(report.get("tail", ""))[-2000:]
    return Grade(statuses=statuses, fail_to_pass=task.fail_to_pass, pass_to_pass=task.pass_to_pass,
                 dropped=dropped, seconds=time.monotonic() - started, retries=run.retries,
                 worker_lost=run.result.killed_reason == "worker_lost", output_tail=tail,
                 workspace_lost=snapshot.lost, canaries=canaries, canaries_skipped=canaries_skipped)

