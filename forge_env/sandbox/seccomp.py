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
               "mq_open": 240},
    "aarch64": {"unshare": 97, "clone": 220, "clone3": 435, "keyctl": 219, "add_key": 217, "request_key": 218,
                "mq_open": 180},
}
REFUSED = ("unshare", "keyctl", "add_key", "request_key", "mq_open")


def supported(machine: str | None = None) -> bool:
    return (machine or os.uname().machine) in _SYSCALLS


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
    code += [
        (_JEQ, nrs["clone3"], "enosys", None),
        (_JEQ, nrs["clone"], None, "allow"),
        (_LD, 16),  # the low 32 bits of clone's flags (args[0])
        (_JSET, CLONE_NEWUSER, "eperm", None),
        ("allow", SECCOMP_RET_ALLOW),
        ("eperm", SECCOMP_RET_ERRNO | errno.EPERM),
        ("enosys", SECCOMP_RET_ERRNO | errno.ENOSYS),
    ]
    labels = {insn[0]: i for i, insn in enumerate(code) if isinstance(insn[0], str)}
    out = bytearray()
    for i, insn in enumerate(code):
        if isinstance(insn[0], str):
            out += struct.pack("=HBBI", _RET, 0, 0, insn[1])
        elif insn[0] == _LD:
            out += struct.pack("=HBBI", _LD, 0, 0, insn[1])
        else:
            op, k, if_true, if_false = insn
            jt = labels[if_true] - i - 1 if if_true else 0
            jf = labels[if_false] - i - 1 if if_false else 0
            out += struct.pack("=HBBI", op, jt, jf, k)
    return bytes(out)
