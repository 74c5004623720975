"""Red team (issue 34, fork server polling): a run that eats its user's pipe quota must not slow other runs.

The fork server reads a run's pipes only every ``OUTPUT_POLL_S`` and relies on widening them (F_SETPIPE_SZ)
so that a run need not wait for a poll. Pipe buffers are charged per user (``fs.pipe-user-pages-soft``):
where workers share a uid (bwrap without root, where every worker runs as the caller; docker with a fixed
``uid``), one run can widen pipes of its own (and of its forked children, each with its own fd limit) past
the soft limit. Every pipe the user creates after that holds 2 pages and cannot be widened, so another
worker's run may wait up to a poll (20 ms) whenever it fills 8 KiB (measured here, 2 busy cores: 1 MiB
through an 8 KiB pipe took 0.21 s polled against 0.04 s woken on output; on a single core, up to 2.6 s):
time counted against that run's timeout (in a group-relative update, a hostile sample gains when its peers
fail). The server must then wake on output, as it did before polling.

The quota is consumed by a child switched to a uid nobody uses, so nothing else on the machine is affected.
"""

from __future__ import annotations

import fcntl
import os
import select
import time

import pytest

from forge_env.sandbox.server import capture as runs

UNUSED_UID = 61_234_567


def soft_limit_pages() -> int:
    try:
        with open("/proc/sys/fs/pipe-user-pages-soft") as f:
            return int(f.read())
    except OSError:
        return 0


def probe_in_quota_exhausted_user(cap: int) -> int:
    """In a forked child as UNUSED_UID: exhaust the pipe quota, then watch a run writing ``cap`` bytes.
    Exit status: 0 if the server's select watched the output pipes, 3 if it never did, 4 setup failed."""
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try:
        os.setgid(UNUSED_UID)
        os.setuid(UNUSED_UID)
        hog = []
        for _ in range(soft_limit_pages() // 256 + 2):  # 1 MiB (256 pages) each, past the soft limit
            r, w = os.pipe()
            hog.append((r, w))
            try:
                fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 1 << 20)
            except OSError:
                break  # already over the soft limit
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        runs.widen_pipes((out_r, err_r), cap)
        if fcntl.fcntl(out_r, fcntl.F_GETPIPE_SZ) > 65536:
            os._exit(4)  # the quota was not exhausted: nothing to show
        writer = os.fork()
        if writer == 0:
            os.close(out_r)
            data = memoryview(b"x" * cap)
            while data:
                data = data[os.write(out_w, data):]
            os._exit(0)
        os.close(out_w)
        os.close(err_w)
        watched = []
        real_select = select.select

        def recording_select(rlist, wlist, xlist, timeout=None):
            watched.extend(rlist)
            return real_select(rlist, wlist, xlist, timeout)

        runs.select.select = recording_select
        capture = runs.Capture(out_r, err_r, cap + 1)
        outcome, _, _ = runs.watch(writer, capture, time.monotonic() + 60)
        capture.drain((out_r, err_r), until_eof=True)
        if outcome != "exited" or len(capture.buffers[out_r]) != cap:
            os._exit(5)
        os._exit(0 if out_r in watched else 3)
    except BaseException:
        os._exit(4)


@pytest.mark.skipif(os.geteuid() != 0 or soft_limit_pages() == 0,
                    reason="needs root (to switch to an unused uid) and a pipe-user-pages-soft limit")
def test_server_wakes_on_output_when_its_pipes_could_not_be_widened():
    code = probe_in_quota_exhausted_user(256 << 10)
    assert code != 4, "could not exhaust the unused uid's pipe quota"
    assert code == 0, ("with its pipes stuck at 8 KiB (the user's pipe quota spent by another run), the server "
                       "only read them every OUTPUT_POLL_S")
