"""Command lines that start a fork server inside bubblewrap, or (fallback) directly on the host.

Two ways to get an unprivileged sandbox, depending on who we are:

- Caller is root: bubblewrap runs privileged (no user namespace) and gives the server only CAP_SETUID and
  CAP_SETGID; the server drops to a random unprivileged uid after preloading, so every process of the run
  has a uid that owns nothing on the host and ``RLIMIT_NPROC`` applies (the kernel exempts uid 0 from
  it even without capabilities, which is why a user namespace mapped onto root would not do). The random
  uid also keeps the process budgets of concurrent workers apart.
- Caller is not root: bubblewrap makes a user namespace (uid 1000 inside, the caller's uid outside),
  forbids nested user namespaces, and the process budget is counted per namespace.

Either way the server is PID 1 of its own PID namespace, with no network, a read-only view of only the
system and Python directories, and private size-capped tmpfs for /tmp and /dev/shm.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forge_env.sandbox import hidden, seccomp
from forge_env.sandbox.base import SandboxLimits, SandboxUnavailableError
from forge_env.sandbox.scratch_mount import ScratchMounts
from forge_env.sandbox.server import server_source

logger = logging.getLogger(__name__)

SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
SANDBOX_UID = 1000
#: Isolated mode (no user site, no PYTHON* variables), no bytecode writing, and UTF-8 mode (stdio and
#: open() use UTF-8 whatever the locale, undecodable bytes round-trip through surrogate escapes).
PYTHON_FLAGS = ("-I", "-B", "-X", "utf8")
#: Random uids for root-started sandboxes are drawn from here (far above any real account).
UID_RANGE = (3_000_000, 3_000_000 + (1 << 24))


def bwrap_executable() -> str | None:
    return shutil.which("bwrap")


def sandbox_env(workdir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment sandboxed code sees: nothing inherited from the host."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "USER": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env.update(extra or {})
    return env


@functools.lru_cache(maxsize=8)
def python_roots(python: str) -> tuple[str, ...]:
    """Directories the interpreter needs (its prefixes, venv included), outside the system directories."""
    # Compared unresolved: a virtualenv's python is a symlink to its base, and which venv it is (its
    # pyvenv.cfg) follows from the path it is started by, not from the file it resolves to.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        prefixes = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
    else:
        out = subprocess.run(
            [python, "-I", "-S", "-c", "import sys, json; print(json.dumps([sys.prefix, sys.exec_prefix, "
             "sys.base_prefix, sys.base_exec_prefix]))"], capture_output=True, text=True, timeout=30, check=True)
        prefixes = json.loads(out.stdout)
        # -S keeps the interpreter from running any .pth file of its directories on the host; it also keeps
        # site from switching sys.prefix to a virtualenv, so find the venv the way site does: a pyvenv.cfg
        # beside the executable's directory or one above.
        here = os.path.dirname(os.path.abspath(python))
        for candidate in (here, os.path.dirname(here)):
            if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
                prefixes.append(candidate)
                break
    prefixes.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    roots: list[str] = []
    for prefix in sorted({os.path.realpath(p) for p in prefixes} | {os.path.abspath(p) for p in prefixes}, key=len):
        if prefix == "/":
            raise SandboxUnavailableError(f"the interpreter {python} lives at the file system root; use one "
                                          f"installed under a prefix such as /usr or a virtualenv")
        if prefix.startswith("/usr/") or prefix == "/usr" or any(prefix.startswith(r + "/") or prefix == r for r in roots):
            continue
        roots.append(prefix)
    return tuple(roots)


def _parents(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass(frozen=True)
class Launch:
    """How to start one worker: argv, environment and the uid/gid the server runs its code as."""

    argv: list[str]
    env: dict[str, str]
    run_as: tuple[int, int] | None  # host uid/gid the server drops to (root callers only)
    bwrap: bool  # argv starts with bubblewrap
    seccomp: bytes | None = None  # a filter for bubblewrap to load (see seccomp.py)
    mounts: ScratchMounts | None = None  # host tmpfs bound as /tmp and /dev/shm, detached once started
    generation: int = 0  # of hidden.hidden_paths() this worker masks (see hidden.py)


def random_uid() -> int:
    return random.randrange(*UID_RANGE)


def server_config(kind: str, scratch: list[str], preload: tuple[str, ...], drop: tuple[int, int] | None,
                  keep: tuple[str, ...] = ()) -> str:
    """The worker's settings; ``keep``: read-only binds inside the scratch directories, never wiped."""
    return json.dumps({"kind": kind, "scratch": scratch, "preload": list(preload), "drop": drop, "keep": list(keep)})


def bwrap_launch(python: str, limits: SandboxLimits, *, kind: str, preload: tuple[str, ...],
                 ro_binds: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 masked: tuple[str, ...] = ()) -> Launch:
    """The bubblewrap command line for one worker (see the module docstring for the two modes).

    ``masked``: host directories inside the bound ones that the sandbox sees empty (installed packages
    outside the interpreter's allow-list: see interpreter.py), besides the registered task data (hidden.py).
    """
    bwrap = bwrap_executable()
    if bwrap is None:
        raise SandboxUnavailableError("bubblewrap (`bwrap`) is not installed; install the Debian/Ubuntu package "
                                      "`bubblewrap`, or use isolation='rlimits' (weaker) or the docker backend")
    privileged = os.geteuid() == 0
    argv = [bwrap, "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox"]
    if privileged:
        argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                 "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        uid = random_uid()
        drop: tuple[int, int] | None = (uid, uid)
    else:
        argv += ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns"]
        drop = None
    made: set[str] = set()

    def ensure_parents(dest: str) -> None:
        for parent in _parents(dest):
            if parent not in made:
                made.add(parent)
                argv.extend(["--perms", "0755", "--dir", parent])

    argv += ["--ro-bind", "/usr", "/usr"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    ensure_parents("/etc/x")
    for name in ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    size = limits.workdir_size_mb * 1024 * 1024
    scratch = ["/tmp", "/dev/shm"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    roots = python_roots(python) + tuple(os.path.realpath(p) for p in ro_binds)  # (may raise: before mounting)
    mounts = scratch_mounts(size, limits.max_files) if privileged else None
    if mounts is not None:
        argv += ["--bind", mounts.tmp, "/tmp", "--bind", mounts.shm, "/dev/shm"]
    else:  # bubblewrap cannot cap a tmpfs's inodes: see docs/sandbox.md
        argv += ["--perms", "1777", "--size", str(size), "--tmpfs", "/tmp",
                 "--perms", "1777", "--size", str(size), "--tmpfs", "/dev/shm"]
    made.update(["/dev", *scratch])
    # After the tmpfs mounts, so that an interpreter living under /tmp (a clone in /tmp/x/.venv) stays visible.
    for root in roots:
        ensure_parents(root)
        argv += ["--ro-bind", root, root]
    keep = tuple(r for r in roots if any(r.startswith(d + "/") for d in scratch))
    generation = hidden.generation()
    # A registered path inside a directory masked here is gone already (and could not be bound over in it);
    # only the masks that apply (inside what is bound) count: a masked directory outside every bound one may
    # still hold a bound directory (ro_binds) whose registered files must be masked.
    visible = ("/usr", *SYSTEM_DIRS, "/etc", *roots)
    applied = tuple(m for m in masked if any(m == r or m.startswith(r.rstrip("/") + "/") for r in visible))
    hidden_here = tuple(p for p in hidden.hidden_paths() if not any(p.startswith(m.rstrip("/") + "/") for m in applied))
    argv += mask_args((*applied, *hidden_here), visible)
    # bubblewrap's /dev is a tmpfs without a size, owned by the sandbox's uid when the caller is not root:
    # writable, never wiped and unbounded unless made read-only (/dev/shm is a mount of its own).
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--clearenv"]
    for key, value in sandbox_env("/tmp/run", env).items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", "/tmp", python, *PYTHON_FLAGS, "-c", server_source(),
             server_config(kind, scratch, preload, drop, keep)]
    program = seccomp.filter_program() if seccomp.supported() else None
    if program is None:
        _warn_once(f"sandbox: no seccomp filter for {os.uname().machine}: sandboxed code may create user "
                   f"namespaces and use kernel keyrings")
    return Launch(argv=argv, env={}, run_as=drop, bwrap=True, seccomp=program, mounts=mounts,
                  generation=generation)


def mask_args(paths: tuple[str, ...], visible: tuple[str, ...]) -> list[str]:
    """bubblewrap arguments that replace each of ``paths`` lying under a ``visible`` directory by an empty
    read-only file or directory (task data that sandboxed code must not read; see hidden.py)."""
    args: list[str] = []
    for path in paths:
        if not any(path == root or path.startswith(root.rstrip("/") + "/") for root in visible):
            continue
        if os.path.isdir(path):
            args += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            args += ["--ro-bind", _empty_file(), path]  # (not /dev/null: the binds are nodev)
    return args


@functools.cache
def _empty_file() -> str:
    """An empty read-only host file to bind over masked files (removed when this process exits)."""
    fd, path = tempfile.mkstemp(prefix="forge-sandbox-empty-")
    os.close(fd)
    os.chmod(path, 0o444)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def scratch_mounts(size_bytes: int, inodes: int) -> ScratchMounts | None:
    """The worker's /tmp and /dev/shm as host tmpfs with an inode limit, or None where mounting fails."""
    try:
        return ScratchMounts(size_bytes, inodes)
    except OSError as exc:
        _warn_once(f"sandbox: cannot mount a private tmpfs ({exc}); /tmp and /dev/shm have no inode limit")
        return None


@functools.cache
def _warn_once(message: str) -> None:
    logger.warning(message)


def rlimits_launch(python: str, scratch: str, *, kind: str, preload: tuple[str, ...],
                   env: dict[str, str] | None = None) -> Launch:
    """Start the server directly on the host: rlimits, a private directory and (as root) an unprivileged
    uid, but no namespaces: the code can see the host's files and network. A fallback only."""
    drop = None
    if os.geteuid() == 0:
        uid = random_uid()
        drop = (uid, uid)
        os.chown(scratch, uid, uid)
    argv = [python, *PYTHON_FLAGS, "-c", server_source(), server_config(kind, [scratch], preload, drop)]
    return Launch(argv=argv, env=sandbox_env(os.path.join(scratch, "run"), env), run_as=drop, bwrap=False)
