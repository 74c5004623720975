"""A seccomp filter for sandboxed code: no new user namespaces, no kernel keyrings, no POSIX message queues.

bubblewrap loads it (``--seccomp FD``) right before it starts the fork server, so it binds every process of
the sandbox. What it refuses, and why:

- ``unshare`` (any flags) and ``clone`` with ``CLONE_NEWUSER``: inside a new user namespace a process holds
  every capability over it (mount a tmpfs, build network namespaces...). bubblewrap's own
  ``--disable-userns`` needs ``--unshare-user``, which for a root caller would map the sandbox onto the
  host's root, so a root caller gets this filter instead (a non-root caller gets both).
  ``clone3`` answers ENOSYS: its flags live in memory a filter cannot read, and the C library then falls
  back to ``clone``.
- ``keyctl``, ``add_key``, ``request_key``: keyrings are not namespaced; the session keyring comes from the
  host and the user keyring is shared by every process of a uid, so a run could read host keys or leave
  keys for the next run (Docker's default profile refuses them for the same reason).
- ``mq_open``: POSIX message queues live in the worker's IPC namespace, where a run could leave one for the
  next run and the server cannot list them (no mqueue file system inside).
- ``prlimit64``, ``setpriority``, ``ioprio_set`` and the ``sched_set*`` calls on any process but the
  caller (pid/who 0): the fork server and the zygote share the run's uid, so a run could otherwise lower
  the zygote's hard limits (``RLIMIT_AS`` of 30 MB) or its priority (nice 19, ``SCHED_IDLE``, one CPU),
  and every later run, forked from it, would inherit them: a worker poisoned for other submissions.
  A run still sets its own (``resource.setrlimit``, ``os.nice``, ``os.sched_setaffinity(0, ...)``); its
  own pid or a thread's tid is refused like any other (a filter cannot know whose pid it is).
- ``io_uring_*``, ``userfaultfd``, ``bpf``, ``perf_event_open``: kernel attack surface that no test or
  solution needs (the usual tools of kernel exploits, and io_uring's operations bypass seccomp), refused
  as Docker's default profile refuses them; ``perf_event_open`` is also a timing side channel.
- Every system call of a foreign ABI (32-bit ``int 0x80`` or x32 on x86-64) answers ENOSYS, so none of the
  above can be reached under another number.
"""

from __future__ import annotations

import errno
import os
import struct

SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {
    "x86_64": {"unshare": 272, "clone": 56, "clone3": 435, "keyctl": 250, "add_key": 248, "request_key": 249,
               "mq_open": 240, "prlimit64": 302, "setpriority": 141, "ioprio_set": 251, "sched_setparam": 142,
               "sched_setscheduler": 144, "sched_setaffinity": 203, "sched_setattr": 314, "io_uring_setup": 425,
               "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323, "bpf": 321,
               "perf_event_open": 298},
    "aarch64": {"unshare": 97, "clone": 220, "clone3": 435, "keyctl": 219, "add_key": 217, "request_key": 218,
                "mq_open": 180, "prlimit64": 261, "setpriority": 140, "ioprio_set": 30, "sched_setparam": 118,
                "sched_setscheduler": 119, "sched_setaffinity": 122, "sched_setattr": 274, "io_uring_setup": 425,
                "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282, "bpf": 280,
                "perf_event_open": 241},
}
REFUSED = ("unshare", "keyctl", "add_key", "request_key", "mq_open", "io_uring_setup", "io_uring_enter",
           "io_uring_register", "userfaultfd", "bpf", "perf_event_open")
#: Calls allowed only on the calling process: {name: ((argument index, required low 32 bits), ...)}.
#: Only the low 32 bits are compared because the kernel reads these arguments as 32-bit ints.
SELF_ONLY = {
    "prlimit64": ((0, 0),),  # pid
    "setpriority": ((0, 0), (1, 0)),  # which = PRIO_PROCESS, who
    "ioprio_set": ((0, 1), (1, 0)),  # which = IOPRIO_WHO_PROCESS, who
    "sched_setparam": ((0, 0),),
    "sched_setscheduler": ((0, 0),),
    "sched_setaffinity": ((0, 0),),
    "sched_setattr": ((0, 0),),
}


def supported(machine: str | None = None) -> bool:
    return (machine or os.uname().machine) in _SYSCALLS


def _arg_low(index: int) -> int:
    return 16 + 8 * index  # seccomp_data.args[index], low half (both supported ABIs are little-endian)


def filter_program(machine: str | None = None) -> bytes:
    """The filter as an array of ``struct sock_filter`` (what ``bwrap --seccomp`` reads)."""
    machine = machine or os.uname().machine
    if machine not in _SYSCALLS:
        raise ValueError(f"no seccomp filter for {machine}")
    nrs = _SYSCALLS[machine]
    code: list[tuple] = [
        (_LD, 4),  # seccomp_data.arch
        (_JEQ, _AUDIT_ARCH[machine], None, "enosys"),
        (_LD, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        code.append((_JGE, X32_SYSCALL_BIT, "enosys", None))
    code += [(_JEQ, nrs[name], "eperm", None) for name in REFUSED]
    code += [(_JEQ, nrs[name], f"self:{name}", None) for name in SELF_ONLY]
    code += [
        (_JEQ, nrs["clone3"], "enosys", None),
        (_JEQ, nrs["clone"], None, "allow"),
        (_LD, _arg_low(0)),  # clone's flags
        (_JSET, CLONE_NEWUSER, "eperm", "allow"),
    ]
    for name, checks in SELF_ONLY.items():
        code.append(("label", f"self:{name}"))
        for position, (index, value) in enumerate(checks):
            last = position == len(checks) - 1
            code += [(_LD, _arg_low(index)), (_JEQ, value, "allow" if last else None, "eperm")]
    code += [
        ("ret", "allow", SECCOMP_RET_ALLOW),
        ("ret", "eperm", SECCOMP_RET_ERRNO | errno.EPERM),
        ("ret", "enosys", SECCOMP_RET_ERRNO | errno.ENOSYS),
    ]
    return _assemble(code)


def _assemble(code: list[tuple]) -> bytes:
    """Resolve labels (``("label", name)`` marks the next instruction, ``("ret", name, value)`` is a
    labelled return) into relative jumps and pack the instructions."""
    labels, emitted = {}, []
    for insn in code:
        if insn[0] == "label":
            labels[insn[1]] = len(emitted)
        else:
            if insn[0] == "ret":
                labels[insn[1]] = len(emitted)
            emitted.append(insn)
    out = bytearray()
    for i, insn in enumerate(emitted):
        if insn[0] == "ret":
            out += struct.pack("=HBBI", _RET, 0, 0, insn[2])
        elif insn[0] == _LD:
            out += struct.pack("=HBBI", _LD, 0, 0, insn[1])
        else:
            op, k, if_true, if_false = insn
            jt = labels[if_true] - i - 1 if if_true else 0
            jf = labels[if_false] - i - 1 if if_false else 0
            if not (0 <= jt < 256 and 0 <= jf < 256):
                raise ValueError("seccomp jump out of range")
            out += struct.pack("=HBBI", op, jt, jf, k)
    return bytes(out)
