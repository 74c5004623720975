"""Capturing a run's output: capped buffers over its stdout/stderr pipes, and the wait for it to end."""

import fcntl
import os
import resource  # noqa: F401  (os.wait4 imports it to build its rusage; a server that dropped privileges may not)
import select
import time

from .wire import KILL_GRACE_S, b64


class Capture:
    """Reads a run's stdout/stderr pipes into capped buffers."""

    def __init__(self, out_r, err_r, cap):
        self.buffers = {out_r: bytearray(), err_r: bytearray()}
        self.out_r, self.err_r, self.cap = out_r, err_r, cap
        self.overflow = False
        for fd in self.buffers:
            os.set_blocking(fd, False)
        # Read only every OUTPUT_POLL_S (see watch) if the pipes hold what a run may write between two polls;
        # else (the user's pipe quota is spent, e.g. by another run of this uid: new pipes hold 8 KiB and
        # cannot be widened, and such a run would wait a poll per 8 KiB) wake on its output as before.
        self.polled = all(pipe_size(fd) >= min(cap + 1, MAX_WIDENED) for fd in self.buffers)

    def read(self, fd):
        """Read what is there; return False at end of file."""
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return True
            if not data:
                return False
            buf = self.buffers[fd]
            room = self.cap - len(buf)
            if len(data) > room:
                buf += data[:max(room, 0)]
                self.overflow = True
                return True
            buf += data

    def drain(self, fds, until_eof, budget_s=KILL_GRACE_S):
        fds = list(fds)
        deadline = time.monotonic() + budget_s
        while fds:
            fds = [fd for fd in fds if self.read(fd)]
            if not until_eof or not fds or time.monotonic() > deadline:
                return
            select.select(fds, [], [], max(0.0, deadline - time.monotonic()))

    def result(self):
        return b64(self.buffers[self.out_r]), b64(self.buffers[self.err_r])


#: While a run goes on, the server sleeps until it exits (its pidfd) and reads its output pipes every
#: OUTPUT_POLL_S, not on every write: a check writes a record per test, and waking for each cost a
#: context switch and two system calls (half the server's switches per HumanEval check). Nothing is lost:
#: what sits in a pipe is read when the run ends (or is killed); a run that fills a pipe waits for the next
#: read, and one past ``max_output_bytes`` is killed at most a poll or two later than before.
OUTPUT_POLL_S = 0.02
PIPE_BYTES = 65536  # a pipe's default capacity (Linux)
MAX_WIDENED = 1 << 20  # the most widen_pipes asks for (fs.pipe-max-size's default, for unprivileged users)


def pipe_size(fd):
    try:
        return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (OSError, AttributeError):
        return 0  # (not a pipe, or no F_GETPIPE_SZ: wake on output)


def widen_pipes(fds, cap):
    """Let the pipes hold ``cap`` bytes and one more (as far as ``fs.pipe-max-size`` allows), so that a run
    writing up to its output limit between two polls need not wait for them; pipes hold 64 KiB already."""
    if cap < PIPE_BYTES:
        return
    for fd in fds:
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, min(cap + 1, MAX_WIDENED))
        except (OSError, AttributeError):
            pass  # over the user's pipe budget, or no F_SETPIPE_SZ: the run waits for the next poll instead


def watch(pid, capture, deadline, extra_fd=None):
    """Wait for ``pid`` to exit (or ``extra_fd`` to become readable) while capturing output.

    Returns ("exited", status, rusage) | ("extra", None, None) | ("timeout"|"output_limit", None, None).
    After "exited" or "extra", output may still sit in the pipes: the caller drains them.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    open_fds = [capture.out_r, capture.err_r]
    try:
        while True:
            if capture.overflow:
                return "output_limit", None, None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout", None, None
            if pidfd is not None and capture.polled:  # wake on exit (or extra_fd), read the pipes every poll
                watched = [fd for fd in (pidfd, extra_fd) if fd is not None]
                ready, _, _ = select.select(watched, [], [], min(remaining, OUTPUT_POLL_S))
                if not ready:
                    open_fds = [fd for fd in open_fds if capture.read(fd)]
                    continue
            else:  # wake on output; on exit too (pidfd), else (kernel < 5.3) look for it every 5 ms
                watched = open_fds + [fd for fd in (pidfd, extra_fd) if fd is not None]
                ready, _, _ = select.select(watched, [], [], min(remaining, 0.005) if pidfd is None else remaining)
                for fd in ready:
                    if fd in open_fds and not capture.read(fd):
                        open_fds.remove(fd)
            if extra_fd is not None and extra_fd in ready:
                return "extra", None, None
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return "exited", status, usage
    finally:
        if pidfd is not None:
            os.close(pidfd)
