"""Repositories, found offline, and the per-task base checkout every episode starts from.

``repos_dir/<owner>__<name>`` (the layout SWE-bench tooling uses for local mirrors) or a row's own
``repo_path`` is a git repository that holds ``base_commit``. :func:`check_repo` runs at load (a missing
repository or commit is an error there, not at step time). :func:`base_checkout` builds, once per task
and cached, what episodes and grading need:

- the tree of ``base_commit`` (``git archive``: the files only, no history);
- ``workspace_tar``: that tree plus a *fresh* ``.git`` holding a single commit of it, so ``git diff`` and
  ``git status`` work in the workspace while no object or ref of the mirror (whose later commits hold the
  fix) ever enters it;
- the tree with ``test_patch`` applied (what grading runs), and the paths ``test_patch`` touches.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from environments.swe.tasks import SWETask, SWETaskError
from forge_env.sandbox import hide_from_sandboxes

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "forge-env",
           "GIT_AUTHOR_EMAIL": "forge-env@localhost", "GIT_COMMITTER_NAME": "forge-env",
           "GIT_COMMITTER_EMAIL": "forge-env@localhost", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z", "LC_ALL": "C"}


def git(*args: str, cwd: str | Path, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run git on the host (trusted data only) with a fixed identity and no user configuration."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GIT_ENV}
    result = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, env=env, timeout=300)
    if check and result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed in {cwd}: {result.stderr.decode(errors='replace')[:500]}")
    return result


def repo_path(task: SWETask, repos_dir: str | Path | None) -> Path:
    """Where ``task``'s repository is: its ``repo_path``, else ``repos_dir/<owner>__<name>``."""
    if task.repo_path:
        return Path(task.repo_path)
    if repos_dir is None:
        raise SWETaskError(f"{task.instance_id}: the row has no 'repo_path' and no repos_dir was given; pass "
                           f"repos_dir= (a directory of mirrors named like {task.mirror_name!r})")
    return Path(repos_dir) / task.mirror_name


def check_repo(task: SWETask, repos_dir: str | Path | None) -> Path:
    """The task's repository, checked to exist and hold ``base_commit``; SWETaskError otherwise."""
    path = repo_path(task, repos_dir)
    if not path.is_dir():
        raise SWETaskError(f"{task.instance_id}: repository {task.repo!r} not found at {path} (a local mirror "
                           f"is needed; nothing is fetched)")
    found = git("rev-parse", "--git-dir", cwd=path, check=False)
    if found.returncode != 0:
        raise SWETaskError(f"{task.instance_id}: {path} is not a git repository")
    has = git("cat-file", "-e", f"{task.base_commit}^{{commit}}", cwd=path, check=False)
    if has.returncode != 0:
        raise SWETaskError(f"{task.instance_id}: base_commit {task.base_commit} is not in {path}")
    hide_from_sandboxes(path)  # its later commits hold the fix: masked should it lie under a bound directory
    return path


@dataclass(frozen=True)
class BaseCheckout:
    """What a task's episodes and grading start from (see the module docstring)."""

    files: dict[str, bytes]  # the tree of base_commit (regular files), path -> content
    links: dict[str, str]  # symlinks in that tree, path -> target
    modes: dict[str, int]  # executable files' modes
    workspace_tar: bytes  # the tree + a fresh .git with one commit of it (tar.gz)
    test_tree: dict[str, bytes]  # the tree with test_patch applied
    test_paths: frozenset[str]  # files test_patch adds, changes or deletes

    @property
    def manifest(self) -> dict[str, str]:
        """sha256 of every base file (and ``link:<target>`` for symlinks)."""
        found = self.__dict__.get("_manifest")
        if found is None:
            found = {p: hashlib.sha256(b).hexdigest() for p, b in self.files.items()}
            found.update({p: "link:" + t for p, t in self.links.items()})
            object.__setattr__(self, "_manifest", found)
        return found


_cache: dict[tuple[str, str, str], BaseCheckout] = {}
_lock = threading.Lock()


def base_checkout(task: SWETask, repos_dir: str | Path | None) -> BaseCheckout:
    """The task's :class:`BaseCheckout`, built on first use and cached per repository, commit and test patch."""
    path = os.path.realpath(repo_path(task, repos_dir))
    key = (path, task.base_commit, hashlib.sha256(task.test_patch.encode()).hexdigest())
    with _lock:
        found = _cache.get(key)
    if found is None:
        found = _build(task, Path(path))
        with _lock:
            _cache[key] = found
    return found


def read_tree(root: Path) -> tuple[dict[str, bytes], dict[str, str], dict[str, int]]:
    """Regular files, symlinks and executable modes under ``root`` (``.git`` left out)."""
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    modes: dict[str, int] = {}
    for directory, dirs, names in os.walk(root):
        if directory == str(root) and ".git" in dirs:
            dirs.remove(".git")
        for name in names + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            full = os.path.join(directory, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                links[rel] = os.readlink(full)
            elif os.path.isfile(full):
                files[rel] = Path(full).read_bytes()
                if os.stat(full).st_mode & 0o111:
                    modes[rel] = 0o755
    return files, links, modes


def _build(task: SWETask, repo: Path) -> BaseCheckout:
    with tempfile.TemporaryDirectory(prefix="forge-swe-base-") as tmp:
        tree = Path(tmp) / "repo"
        tree.mkdir()
        archive = git("archive", "--format=tar", task.base_commit, cwd=repo).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="tar")
        files, links, modes = read_tree(tree)
        git("init", "-q", "-b", "main", cwd=tree)
        git("add", "-A", "-f", cwd=tree)
        git("commit", "-q", "--no-gpg-sign", "--allow-empty", "-m", f"base of {task.instance_id}", cwd=tree)
        git("repack", "-a", "-d", "-q", cwd=tree)  # one pack instead of a file per object: faster to unpack
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
            tar.add(tree, arcname="repo")
        patched = Path(tmp) / "patched"
        shutil.copytree(tree, patched, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        git("init", "-q", cwd=patched)  # so that git apply works relative to this directory, whatever is above
        applied = git("apply", "--whitespace=nowarn", "-", cwd=patched, stdin=task.test_patch.encode(), check=False)
        if applied.returncode != 0:
            raise SWETaskError(f"{task.instance_id}: test_patch does not apply to base_commit "
                               f"({applied.stderr.decode(errors='replace').strip()[:300]})")
        test_tree, test_links, _ = read_tree(patched)
    touched = {p for p in set(files) | set(test_tree) if files.get(p) != test_tree.get(p)}
    touched |= {p for p in set(links) | set(test_links) if links.get(p) != test_links.get(p)}
    return BaseCheckout(files=files, links=links, modes=modes, workspace_tar=buffer.getvalue(),
                        test_tree=test_tree, test_paths=frozenset(touched))
