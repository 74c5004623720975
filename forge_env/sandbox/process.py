"""The ``process`` backend: fork servers in bubblewrap namespaces, no daemon needed.

Each worker is one bubblewrap sandbox whose PID 1 is the fork server (``server/``); a run costs a fork
of a warm interpreter (its zygote) rather than a fresh interpreter and namespace. Each worker also gets a
seccomp filter (``seccomp.py``), a memory cgroup where the host allows one (``cgroup.py``) and, for a root
caller, inode-limited tmpfs (``scratch_mount.py``); docs/sandbox.md has the threat model. Without bubblewrap (or without the
kernel features it needs) the backend falls back to rlimits only, with a logged warning, unless
``isolation="bwrap"`` was asked for explicitly.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import tempfile
from typing import Any, Literal

from forge_env.sandbox import hidden
from forge_env.sandbox.base import SandboxError, SandboxLimits, SandboxUnavailableError
from forge_env.sandbox.bwrap import Launch, bwrap_executable, bwrap_launch, rlimits_launch
from forge_env.sandbox.cgroup import MemoryCgroup, clean_exit, memory_cgroups, worker_memory_bytes
from forge_env.sandbox.interpreter import lean_python, package_dirs, trainer_dirs
from forge_env.sandbox.pool import PooledSandbox
from forge_env.sandbox.workers import WorkerFailure

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "rlimits"]
STARTUP_TIMEOUT_S = 30.0
MAX_FRAME = 256 * 1024 * 1024

# Set once bubblewrap has failed on this machine, so later sandboxes fall back without trying again.
_bwrap_broken: str | None = None
# Set once a bubblewrap worker has started in this process. From then on a failed start is a failure of the
# machine (raised, an InfraError), never a reason to fall back: graded code could otherwise provoke one (use
# up the caller's process budget, slow a respawn past its timeout) and have every later run, in every
# "auto" sandbox of the process, go without namespaces and read the host's files (red team, issue 42).
_bwrap_worked = False


def encode_frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">I", len(data)) + data


async def wait_ready(fd: int, *, write: bool = False, timeout: float | None = None) -> bool:
    """Wait until ``fd`` is readable (or writable) on the running loop; False on timeout.

    The fd is registered with the loop only for this wait, so a worker is not tied to any one loop.
    """
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(True)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        return await asyncio.wait_for(ready, timeout)
    except TimeoutError:
        return False
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


class ProcessWorker:
    """A fork server process reached through non-blocking pipes to its stdin and stdout."""

    def __init__(self, proc: subprocess.Popen, scratch: str | None, cgroup: MemoryCgroup | None = None) -> None:
        self._proc = proc
        self._scratch = scratch  # host directory to remove on close (rlimits mode only)
        self._cgroup = cgroup
        self._oom_kills = 0
        self.generation = 0  # of the hidden paths it masks (hidden.py)
        self._server_pid: int | None = None
        self._server_pidfd: int | None = None
        self._buffer = bytearray()
        self._stderr_tail = bytearray()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._in, self._out, self._err = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
        for fd in (self._in, self._out, self._err):
            os.set_blocking(fd, False)

    @classmethod
    async def start(cls, launch: Launch, scratch: str | None = None,
                    cgroup: MemoryCgroup | None = None) -> ProcessWorker:
        argv, info_r, pass_fds = list(launch.argv), None, []
        try:
            if launch.bwrap:
                # bubblewrap tells us the host pid of the sandbox's PID 1, which we kill directly on close: its
                # --die-with-parent signal cannot reach a server that changed uid (see close()).
                info_r, info_w = os.pipe()
                pass_fds.append(info_w)
                argv[1:1] = ["--info-fd", str(info_w)]
                if launch.seccomp is not None:
                    seccomp_fd = os.memfd_create("forge-seccomp")
                    pass_fds.append(seccomp_fd)
                    os.write(seccomp_fd, launch.seccomp)
                    os.lseek(seccomp_fd, 0, os.SEEK_SET)
                    argv[1:1] = ["--seccomp", str(seccomp_fd)]
            if cgroup is not None:
                argv = cgroup.wrap(argv)
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=launch.env, cwd=scratch or "/", start_new_session=True,
                                    pass_fds=pass_fds)
        except BaseException:
            if launch.mounts is not None:
                launch.mounts.detach()
            if info_r is not None:
                os.close(info_r)
            raise
        finally:
            for fd in pass_fds:
                os.close(fd)
        worker = cls(proc, scratch, cgroup)
        worker.generation = launch.generation
        try:
            hello = await worker._read_frame(STARTUP_TIMEOUT_S)
            if not hello.get("ready"):
                raise WorkerFailure(f"unexpected greeting {hello!r}")
            if info_r is not None:
                worker._watch_server(info_r)
            else:
                worker._server_pid = proc.pid
        except WorkerFailure as exc:
            await worker.close()
            raise SandboxUnavailableError(f"the sandbox worker did not start: {exc}") from None
        finally:
            if info_r is not None:
                os.close(info_r)
            if launch.mounts is not None:
                launch.mounts.detach()  # the sandbox holds them now; nothing else on the host sees them
        return worker

    def _watch_server(self, info_r: int) -> None:
        os.set_blocking(info_r, False)
        try:
            info = json.loads(os.read(info_r, 65536).decode())
            self._server_pid = int(info["child-pid"])
            self._server_pidfd = os.pidfd_open(self._server_pid)
        except (OSError, ValueError, KeyError) as exc:
            raise WorkerFailure(f"bubblewrap did not report the sandbox's pid: {exc}") from exc

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def pids(self) -> list[int]:
        return [pid for pid in (self._proc.pid, self._server_pid) if pid is not None]

    @property
    def host_paths(self) -> list[str]:
        """Host directories this worker owns (rlimits mode; its memory cgroup), removed with it."""
        return [path for path in (self._scratch, self._cgroup and self._cgroup.path) if path]

    def _diagnostics(self) -> str:
        try:
            while chunk := os.read(self._err, 65536):
                self._stderr_tail = (self._stderr_tail + chunk)[-4096:]
        except (BlockingIOError, OSError):
            pass
        tail = self._stderr_tail.decode("utf-8", errors="replace").strip()
        status = "running" if self.alive else f"exit status {self._proc.returncode}"
        return f"{status}; stderr: {tail[-2000:]!r}" if tail else status

    async def _read_exact(self, n: int, deadline: float) -> bytes:
        loop = asyncio.get_running_loop()
        while len(self._buffer) < n:
            try:
                chunk = os.read(self._out, 1 << 16)
            except BlockingIOError:
                if not await wait_ready(self._out, timeout=max(0.0, deadline - loop.time())):
                    raise WorkerFailure(f"no reply in time ({self._diagnostics()})") from None
                continue
            if not chunk:
                await asyncio.sleep(0.05)  # give the exit status and last words a moment to arrive
                raise WorkerFailure(f"the worker exited ({self._diagnostics()})")
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def _read_frame(self, timeout: float) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        (size,) = struct.unpack(">I", await self._read_exact(4, deadline))
        if size > MAX_FRAME:
            raise WorkerFailure(f"oversized reply ({size} bytes)")
        body = await self._read_exact(size, deadline)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise WorkerFailure(f"unreadable reply: {exc}") from exc

    async def _write(self, data: bytes, timeout: float) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._in, view):]
            except BlockingIOError:
                if not await wait_ready(self._in, write=True, timeout=timeout):
                    raise WorkerFailure("the worker does not read its requests") from None
            except (BrokenPipeError, OSError) as exc:
                raise WorkerFailure(f"cannot send to the worker: {exc} ({self._diagnostics()})") from exc

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self.alive:
            raise WorkerFailure(f"the worker is not running ({self._diagnostics()})")
        await self._write(encode_frame(message), timeout)
        reply = await self._read_frame(timeout)
        if self._cgroup is not None and not clean_exit(reply):
            kills = self._cgroup.oom_kills()
            if kills > self._oom_kills and reply.get("killed_reason") == "signal:SIGKILL":
                reply["killed_reason"] = "memory"  # the kernel killed it: the worker's memory cgroup was full
            self._oom_kills = kills
        return reply

    async def close(self) -> None:
        """Stop the worker and everything it started (and, in rlimits mode, remove its directory)."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()  # an idle server cleans up and exits on end of input
        # Taken before any await: a second close() running meanwhile (a cancelled request's discard and the
        # sandbox's close) must not close it again (TypeError, or a reused fd number).
        pidfd, self._server_pidfd = self._server_pidfd, None
        if pidfd is not None:
            # When we run as root, bubblewrap's monitor drops its capabilities and so may not signal the
            # server's unprivileged uid: its --die-with-parent is void and we kill PID 1 ourselves, which
            # ends every process of the namespace.
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                if not await wait_ready(pidfd, timeout=10):  # readable once all inside are gone
                    logger.error("sandbox %d did not end within 10s of SIGKILL", self._server_pid)
            except OSError:
                pass
            os.close(pidfd)
        # bubblewrap exits with its sandbox; a bare server gets a moment to kill its run's processes.
        if not await self._wait(1.0):
            self._proc.kill()
            if not await self._wait(10.0):
                logger.error("sandbox worker %d did not exit after SIGKILL", self._proc.pid)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if self._cgroup is not None:
            for _ in range(500):  # its last processes may still be exiting
                if self._cgroup.remove():
                    break
                await asyncio.sleep(0.01)
            else:
                logger.warning("sandbox: could not remove cgroup %s", self._cgroup.path)

    async def _wait(self, timeout: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while self._proc.poll() is None:
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True


class ProcessSandbox(PooledSandbox):
    """Sandboxed Python on this machine: bubblewrap namespaces + rlimits, with a pool of fork servers.

    Args:
        limits: resource limits for every run.
        max_concurrency: runs executing at once (default: CPU count); more wait in line.
        isolation: "auto" (bubblewrap if it works here, else rlimits with a warning), "bwrap" (fail if it
            cannot be used) or "rlimits" (no namespaces: the code sees the host's files and network).
        python: interpreter inside the sandbox. Default: a lean virtualenv over this interpreter's base
            holding the standard library and ``packages`` only (interpreter.py); the trainer's own
            environment is never visible. An interpreter named here is used as it is, whatever it holds.
        packages: the allow-list of installed distributions (with their dependencies) copied into that
            lean interpreter, e.g. ``("numpy",)`` for a task set that needs it; their files are visible to
            the graded code, so never name one that ships task data. Not with ``python``.
        preload: modules each worker imports once so runs get them for free.
        ro_binds: extra host directories made visible, read-only, at the same path.
        env: extra environment variables for the sandboxed code (nothing is inherited from the host).
        max_sessions: persistent sessions open at once.
    """

    def __init__(self, limits: SandboxLimits | None = None, *, max_concurrency: int | None = None,
                 isolation: Isolation = "auto", python: str | None = None,
                 preload: tuple[str, ...] | None = None, ro_binds: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, max_sessions: int = 64,
                 packages: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(limits, max_concurrency=max_concurrency, max_sessions=max_sessions, preload=preload)
        if isolation not in ("auto", "bwrap", "rlimits"):
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'rlimits', got {isolation!r}")
        for path in ro_binds:
            if not os.path.isabs(path) or not os.path.exists(path):
                raise ValueError(f"ro_binds entries must be existing absolute paths, got {path!r}")
        if isinstance(packages, str) or not all(isinstance(p, str) and p for p in packages):
            raise ValueError(f"packages must be a list of distribution names, got {packages!r}")
        if python is not None and packages:
            raise ValueError("packages= builds the sandbox's own interpreter; with python= the interpreter you "
                             "name decides what is installed: give one or the other")
        self.packages = tuple(sorted(set(packages)))
        #: Host directories of installed packages masked in every worker (none for a named interpreter).
        self.masked: tuple[str, ...] = ()
        #: True when the interpreter is the lean one built here: it holds the standard library and
        #: ``packages`` only.
        self.lean = python is None
        if python is None:
            self.python = lean_python(self.packages)
            self.masked = tuple(sorted({*package_dirs(self.python), *trainer_dirs(self.python)}))
        else:
            self.python = python
        self.ro_binds = tuple(ro_binds)
        self.env = dict(env or {})
        self.requested_isolation = isolation
        self.isolation = isolation if isolation != "auto" else ("bwrap" if _usable_bwrap() else "rlimits")
        if isolation == "auto" and self.isolation == "rlimits":
            _warn_fallback(_bwrap_broken or "bubblewrap (`bwrap`) is not installed")

    @property
    def memory_accounting(self) -> str:
        """How a worker's memory is bounded: "cgroup-v1", "cgroup-v2" or "rlimit" (RLIMIT_AS only)."""
        version, _ = memory_cgroups()
        return f"cgroup-{version}" if version else "rlimit"

    def _cgroup(self) -> MemoryCgroup | None:
        version, why = memory_cgroups()
        if version is None:
            _warn_no_cgroup(why)
            return None
        return MemoryCgroup.create(worker_memory_bytes(self.limits.memory_mb, self.limits.workdir_size_mb))

    def _outdated(self, worker: ProcessWorker) -> bool:
        # Task data registered after the worker started is not masked in it (hidden.py): replace it.
        return self.isolation == "bwrap" and worker.generation != hidden.generation()

    async def _spawn(self, kind: str) -> ProcessWorker:
        global _bwrap_broken, _bwrap_worked
        if self.isolation == "bwrap":
            cgroup = self._cgroup()
            try:
                launch = bwrap_launch(self.python, self.limits, kind=kind, preload=self.preload,
                                      ro_binds=self.ro_binds, env=self.env, masked=self.masked)
                worker = await ProcessWorker.start(launch, cgroup=cgroup)
                _bwrap_worked = True
                return worker
            except BaseException as exc:
                if cgroup is not None:
                    cgroup.remove()
                if not isinstance(exc, SandboxUnavailableError):
                    raise
                if self.requested_isolation == "bwrap" or _bwrap_worked:
                    raise SandboxUnavailableError(f"bubblewrap could not start a sandbox: {exc}") from None
                _bwrap_broken = str(exc)
                self.isolation = "rlimits"
                _warn_fallback(_bwrap_broken)
        scratch = tempfile.mkdtemp(prefix="forge-sandbox-")
        try:
            launch = rlimits_launch(self.python, scratch, kind=kind, preload=self.preload, env=self.env)
            cgroup = self._cgroup()
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        try:
            return await ProcessWorker.start(launch, scratch, cgroup)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            if cgroup is not None:
                cgroup.remove()
            raise


def _usable_bwrap() -> bool:
    return _bwrap_broken is None and bwrap_executable() is not None


@functools.cache
def _warn_no_cgroup(reason: str) -> None:
    logger.warning("sandbox: no memory cgroup (%s): memory is bounded only by RLIMIT_AS per process and the tmpfs "
                   "sizes, so memfd, SysV shared memory and kernel objects a run creates are not counted. Run as "
                   "root or delegate a cgroup v2 subtree with the memory controller.", reason)


def _warn_fallback(reason: str) -> None:
    logger.warning("sandbox: namespaces unavailable (%s); falling back to rlimits only: sandboxed code can "
                   "read the host's files and use its network. Install bubblewrap for real isolation.", reason)


__all__ = ["Isolation", "ProcessSandbox", "ProcessWorker", "SandboxError"]
