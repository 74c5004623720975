"""Framing and the few system calls every part of the fork server needs (standard library only).

Messages on the host channel are a 4-byte big-endian length followed by a JSON object.
"""

import base64
import ctypes
import json
import os
import struct

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_THP_DISABLE = 41
SETUP_FAILED_EXIT = 125
KILL_GRACE_S = 2.0

LIBC = ctypes.CDLL(None, use_errno=True)
#: The worker's settings (from the host), shared by every part of the server.
CONFIG: dict = {}


def read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    header = read_exact(fd, 4)
    if header is None:
        return None
    body = read_exact(fd, struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body)


def write_frame(fd, obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def b64(data):
    return base64.b64encode(bytes(data)).decode("ascii")


def prctl(option, value):
    LIBC.prctl(option, value, 0, 0, 0)


def read_fd(fd):
    """Everything readable from ``fd`` (a file or memfd, read from its start)."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def data_fd(data):
    """An fd holding ``data``, positioned at its start (a memfd: no pipe that could deadlock, no file)."""
    fd = os.memfd_create("forge-data", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
