"""One run of a pool worker: files and stdin in, a fresh process from the zygote, capture, kill, wipe."""

import base64
import json
import os
import signal
import time

from .capture import Capture, watch, widen_pipes
from .child import start_run
from .procs import clear_user_keyrings, kill_all, remove_sysv_ipc, untouched
from .wipe import wipe
from .wire import CONFIG, data_fd
from .zygote import SYS_CLONE, Zygote, load_prelude, prelude_key

PRELUDES_KEPT = 16  # prelude texts kept (must match PRELUDES_KEPT in forge_env/sandbox/workers.py)


def write_files(workdir, files):
    for name, content in (files or {}).items():
        path = os.path.normpath(os.path.join(workdir, name))
        if not path.startswith(workdir + "/"):
            raise ValueError(f"file name {name!r} leaves the working directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            data = base64.b64decode(content)
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def stdin_fd_for(data):
    """An fd to read ``data`` (base64) from (a memfd, so no pipe can deadlock), or /dev/null."""
    if data is None:
        return os.open(os.devnull, os.O_RDONLY)
    return data_fd(base64.b64decode(data))


def classify(status, usage, stderr_tail, limits, reason):
    """(exit_code, killed_reason) from a wait status and what the supervisor saw."""
    exit_code = None if status is None else os.waitstatus_to_exitcode(status)
    if reason:
        return exit_code, reason
    if exit_code is not None and exit_code < 0:
        sig = -exit_code
        cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits["cpu_seconds"] - 0.05):
            return exit_code, "cpu"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return exit_code, f"signal:{name}"
    if exit_code and ran_out_of_memory(stderr_tail):
        return exit_code, "memory"
    return exit_code, None


def ran_out_of_memory(stderr_tail):
    """The program ended on an uncaught MemoryError (what hitting the address-space limit looks like)."""
    return stderr_tail.rstrip().rsplit(b"\n", 1)[-1].startswith(b"MemoryError")


def clean_after_run(statuses, spare=frozenset(), killed=False):
    """Kill what is left of the run (unless ``killed`` already) and remove every trace of it: files, SysV
    IPC, keys. Returns what could not be cleaned (the host then retires this worker instead of reusing it)."""
    problems = []
    if not killed and not kill_all(statuses, spare):
        problems.append("processes survived SIGKILL")
    for directory in CONFIG["scratch"]:
        problems += wipe(directory, CONFIG["keep"])
    if CONFIG["pid1"] and remove_sysv_ipc():
        problems.append("SysV IPC objects could not be removed")
    clear_user_keyrings()
    if not untouched():
        problems.append("a run changed the server's limits or priority (every later run would inherit them)")
    return problems


class Ahead:
    """A run process forked before its request (Runner.prepare), and the server's ends of its fds."""

    def __init__(self, pid, key, stdin, payload, out_r, err_r, wake):
        self.pid, self.key = pid, key
        self.stdin, self.payload, self.out_r, self.err_r, self.wake = stdin, payload, out_r, err_r, wake

    def start(self, stdin, payload):
        """Fill its stdin (base64, or None) and payload, then wake it; None if it is gone."""
        for fd, data in ((self.stdin, base64.b64decode(stdin) if stdin else b""), (self.payload, payload)):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.lseek(fd, 0, os.SEEK_SET)  # (the offset is shared with the run's copy of the fd)
        try:
            os.kill(self.pid, signal.SIGCONT)  # (stopped from outside, it would sit out the run's time limit)
            os.write(self.wake, b"0" if stdin is None else b"1")
        except OSError:  # EPIPE: nothing holds the other end any more (or it is gone altogether)
            return None
        return self.pid

    def discard(self, kill=True):
        """Close the server's ends and (``kill``) kill and reap the process (once: later calls do nothing)."""
        if self.pid is None:
            return
        fds, self.stdin = (self.stdin, self.payload, self.out_r, self.err_r, self.wake), None
        for fd in fds:
            os.close(fd)
        pid, self.pid = self.pid, None
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


class Runner:
    """Runs pool requests; keeps the zygote (or, where it cannot start, forks runs itself)."""

    def __init__(self):
        # prelude_key's import, done now: we start before the privilege drop, after which a Python installed
        # where only root may enter cannot import; and not at module level, which the zygote shares.
        import hashlib  # noqa: F401

        wanted = CONFIG.get("zygote", True) and os.uname().machine in SYS_CLONE  # (off: only to measure it)
        self.fork_ahead = CONFIG.get("ahead", True)  # (off: only to measure it)
        self.zygote = Zygote() if wanted else None
        try:
            if self.zygote is not None:
                self.zygote.start()
        except Exception:
            self.zygote = None  # degraded: runs fork from the server (see docs/sandbox.md)
        self.preludes = {}  # prelude texts by key, oldest first (the host tracks the same, see sandbox/workers.py)
        self.ahead = None  # the next run's process, forked ahead of its request (prepare())
        self.last_prelude = None  # what the last run started with: the next one most likely does too

    @property
    def spare(self):
        return {self.zygote.pid} if self.zygote is not None and self.zygote.pid is not None else set()

    def prelude(self, req):
        """(key, text) of the request's prelude, or None: the text comes with the first request naming a
        key, later ones name the key only."""
        key, text = req.get("prelude_key"), req.get("prelude")
        if text is not None:
            key = key or prelude_key(text)
            if key not in self.preludes:
                self.preludes[key] = text
                if len(self.preludes) > PRELUDES_KEPT:
                    self.preludes.pop(next(iter(self.preludes)))
            return key, text
        if key is None:
            return None
        if key not in self.preludes:
            raise LookupError(f"prelude {key[:12]} was never sent to this worker")
        return key, self.preludes[key]

    def prepare(self):
        """Between requests (the last run is over, killed and wiped; the reply is on its way): have the zygote
        fork the next run's process now, with its pipes and empty stdin and payload memfds, so that none of
        that (the fork, the faults after it, the zygote's round trip) is paid while a request waits. It
        holds no code or data until the request comes (see wait_for_run), and it is forked only after the
        last run's processes are gone and the zygote's state was checked: no run can reach it before it
        becomes the next one."""
        if self.zygote is None or self.ahead is not None or not self.fork_ahead:
            return
        stdin, payload = data_fd(b""), data_fd(b"")
        (out_r, out_w), (err_r, err_w), (wake_r, wake_w) = os.pipe(), os.pipe(), os.pipe()
        try:
            pid = self.zygote.fork_ahead([stdin, out_w, err_w, payload, wake_r], self.last_prelude)
        except Exception:
            for fd in (stdin, payload, out_r, out_w, err_r, err_w, wake_r, wake_w):
                os.close(fd)
            return  # the next run forks on demand (and replaces a zygote that is gone)
        for fd in (out_w, err_w, wake_r):
            os.close(fd)
        key = self.last_prelude[0] if self.last_prelude else None
        self.ahead = Ahead(pid, key, stdin, payload, out_r, err_r, wake_w)

    def take_ahead(self, prelude):
        """The process forked ahead if it has ``prelude`` (else it is dropped): None when there is none."""
        self.last_prelude = prelude
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.key != (prelude[0] if prelude else None):
            ahead.discard()
            ahead = None
        return ahead

    def spawn(self, workdir, fds, prelude):
        """A run process forked on demand."""
        if self.zygote is not None:
            return self.zygote.fork_run(workdir, fds, prelude)
        prelude = load_prelude(*prelude) if prelude else None
        pid = os.fork()
        if pid == 0:
            start_run(workdir, fds, prelude)
        return pid

    def clean(self, statuses, killed=False):
        problems = clean_after_run(statuses, self.spare, killed)
        self.reaped(statuses)
        return problems

    def reaped(self, statuses):
        if self.zygote is not None and self.zygote.pid in statuses:
            self.zygote.forget(self.zygote.pid)
        if self.ahead is not None and self.ahead.pid in statuses:
            self.ahead.discard(kill=False)
            self.ahead = None

    def launch(self, ahead, req, payload, workdir, prelude):
        """Start the run: wake ``ahead`` (the process forked ahead) or fork one on demand. Returns (pid,
        started, the fds to close now, the server's read ends, the payload fd of a process forked ahead)."""
        if ahead is not None:
            started = time.monotonic()
            pid = ahead.start(req.get("stdin"), payload)
            if pid is not None:
                # (the payload fd stays open: its offset tells whether the process read its code, see handle)
                return pid, started, [ahead.stdin, ahead.wake], [ahead.out_r, ahead.err_r], ahead.payload
            ahead.discard()  # it is gone: fork one on demand
        fds, ours = [], []
        try:
            fds.append(stdin_fd_for(req.get("stdin")))
            out_r, out_w = os.pipe()
            ours.append(out_r)
            fds.append(out_w)
            err_r, err_w = os.pipe()
            ours.append(err_r)
            fds.append(err_w)
            fds.append(data_fd(payload))
            started = time.monotonic()
            return self.spawn(workdir, fds, prelude), started, fds, ours, None
        except BaseException:
            for fd in fds + ours:
                os.close(fd)
            raise

    def handle(self, req):
        limits = req["limits"]
        prelude = self.prelude(req)
        workdir = os.path.join(CONFIG["scratch"][0], "run")
        os.mkdir(workdir, 0o700)
        ahead = self.take_ahead(prelude)
        try:
            write_files(workdir, req.get("files"))
            payload = json.dumps({"code": req["code"], "limits": limits}).encode()
            pid, started, fds, ours, probe = self.launch(ahead, req, payload, workdir, prelude)
        except BaseException:
            if ahead is not None:
                ahead.discard()
            problems = self.clean({})
            if problems:
                raise RuntimeError("cleanup failed: " + "; ".join(problems)) from None
            raise
        for fd in fds:
            os.close(fd)
        out_r, err_r = ours
        widen_pipes(ours, limits["max_output_bytes"])
        capture = Capture(out_r, err_r, limits["max_output_bytes"])
        statuses, killed = {}, False
        try:
            outcome, status, usage = watch(pid, capture, started + req["timeout"])
            if probe is not None:
                unread = outcome == "exited" and os.lseek(probe, 0, os.SEEK_CUR) == 0
                os.close(probe)
                probe = None
                if unread:
                    # The process forked ahead died before it read its code (killed from outside between
                    # the check of its pipe and the wake-up): nothing of the run happened; fork one on demand.
                    os.close(out_r)
                    os.close(err_r)
                    out_r = err_r = None
                    pid, started, fds, ours, _ = self.launch(None, req, payload, workdir, prelude)
                    for fd in fds:
                        os.close(fd)
                    out_r, err_r = ours
                    widen_pipes(ours, limits["max_output_bytes"])
                    capture = Capture(out_r, err_r, limits["max_output_bytes"])
                    outcome, status, usage = watch(pid, capture, started + req["timeout"])
            duration = time.monotonic() - started
            if outcome == "exited":
                capture.drain((out_r, err_r), until_eof=False)
            killed = kill_all(statuses, self.spare)
            self.reaped(statuses)
            if outcome != "exited":
                status, usage = statuses.get(pid, (None, None))
            capture.drain((out_r, err_r), until_eof=True)
        finally:
            for fd in (out_r, err_r, probe):
                if fd is not None:
                    os.close(fd)
            problems = self.clean(statuses, killed)
        reason = None if outcome == "exited" else outcome
        if capture.overflow:
            reason = "output_limit"
        exit_code, reason = classify(status, usage, bytes(capture.buffers[err_r][-512:]), limits, reason)
        stdout, stderr = capture.result()
        reply = {"stdout": stdout, "stderr": stderr, "exit_code": exit_code, "timed_out": reason == "timeout",
                 "killed_reason": reason, "duration_s": duration, "truncated": capture.overflow}
        if problems:
            reply["retire"] = "; ".join(problems)[:2000]
        return reply

    def close(self):
        if self.ahead is not None:
            self.ahead.discard()
            self.ahead = None
        if self.zygote is not None:
            self.zygote.stop()
