"""Process and kernel-state control for the fork server: privileges, killing a run, SysV IPC, keyrings."""

import os
import resource
import signal
import time

from .wire import LIBC

IPC_RMID = 0
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5


#: Limits a process passes on to its children (and that a process of the same uid may lower with prlimit).
_INHERITED_LIMITS = tuple(getattr(resource, name) for name in (
    "RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_LOCKS", "RLIMIT_MEMLOCK",
    "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_RSS", "RLIMIT_RTPRIO",
    "RLIMIT_SIGPENDING", "RLIMIT_STACK") if hasattr(resource, name))
#: What scheduling_state() said when this process was set up (see untouched()).
BASELINE = []


def scheduling_state():
    """Our limits, nice value, scheduling policy and CPUs: what every later run inherits from us, and what a
    run (it shares our uid) could change from outside where no seccomp filter stops it (docker, rlimits)."""
    return ([resource.getrlimit(which) for which in _INHERITED_LIMITS], os.getpriority(os.PRIO_PROCESS, 0),
            os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, sorted(os.sched_getaffinity(0)))


def untouched():
    """Whether scheduling_state() is still what it was at setup (the first call records it)."""
    state = scheduling_state()
    if not BASELINE:
        BASELINE.append(state)
    return state == BASELINE[0]


def drop_privileges(ids):
    if ids and os.getresuid() != (ids[0],) * 3:  # (a zygote started again later is already there)
        uid, gid = ids
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)


def read_small(path):
    """A small file's bytes with three system calls (open() adds fstat, ioctl, lseek and buffers: per run,
    the server reads several /proc files)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def parent_map():
    """{ppid: [pids]} of every process visible in /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = read_small(f"/proc/{entry}/stat")
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def own_children(pid):
    """Pids of ``pid``'s children (its main thread's: the server has no other), or None where the kernel
    does not list them."""
    try:
        return [int(child) for child in read_small(f"/proc/{pid}/task/{pid}/children").split()]
    except (OSError, ValueError):
        return None


def descendants(root, spare=()):
    """Pids of every live descendant of ``root``, leaving out ``spare`` and what descends from it."""
    children = parent_map()
    found, stack = [], [root]
    while stack:
        for pid in children.get(stack.pop(), ()):
            if pid in spare:
                continue
            found.append(pid)
            stack.append(pid)
    return found


def reap(statuses):
    """Collect every exited child without blocking, recording (status, rusage) by pid."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = (status, usage)


def kill_all(statuses, spare=frozenset(), deadline_s=10.0):
    """SIGKILL every process of the current run (all but us and ``spare``, the zygote) and reap them, until
    none is left. Returns False if some survived ``deadline_s``. A spared pid that turns out to have died
    (it is reaped here) is dropped from ``spare``, so a run cannot hide behind a recycled pid."""
    me = os.getpid()
    spare = set(spare)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if me == 1 and not spare:
            try:
                os.kill(-1, signal.SIGKILL)
                alive = True
            except ProcessLookupError:
                alive = False
        else:
            children = own_children(me)
            # Whatever a run leaves alive is a child of ours (it was one, or it was reparented to us as PID 1
            # or subreaper when its parent ended): when our children are the spared ones, nothing is left.
            pids = [] if children is not None and set(children) <= spare else descendants(me, spare)
            alive = bool(pids)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        reap(statuses)
        spare.difference_update(statuses)
        if not alive:
            return True
        time.sleep(0.0005)
    return False


def remove_sysv_ipc():
    """Delete SysV shared memory, semaphores and queues a run created (they outlive processes).
    Returns how many could not be removed."""
    failed = 0
    for kind in ("shm", "sem", "msg"):
        try:
            data = read_small(f"/proc/sysvipc/{kind}")  # (a header line, unless a run left objects)
            if data.count(b"\n") > 1 and len(data) >= 1 << 16:
                with open(f"/proc/sysvipc/{kind}", "rb") as f:
                    data = f.read()
        except OSError:
            continue
        for line in data.splitlines()[1:]:  # usually none: the header line only
            ident = int(line.split()[1])
            if kind == "shm":
                status = LIBC.shmctl(ident, IPC_RMID, None)
            elif kind == "sem":
                status = LIBC.semctl(ident, 0, IPC_RMID)
            else:
                status = LIBC.msgctl(ident, IPC_RMID, None)
            failed += status != 0
    return failed


def fresh_session_keyring():
    """Leave the host's session keyring for a new, empty one (where keyctl is not refused outright)."""
    LIBC.syscall(_keyctl_nr(), KEYCTL_JOIN_SESSION_KEYRING, None)


def clear_user_keyrings():
    """Empty the per-uid keyrings, which every process of our uid shares (best effort: see docs)."""
    for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        LIBC.syscall(_keyctl_nr(), KEYCTL_CLEAR, ring)


_KEYCTL = {}


def _keyctl_nr():
    if not _KEYCTL:
        _KEYCTL[0] = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine, -1)
    return _KEYCTL[0]
