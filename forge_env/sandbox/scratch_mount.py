"""Private tmpfs mounts with an inode limit, made on the host for one bubblewrap worker (root callers).

bubblewrap's ``--tmpfs`` takes a size but no inode count, and a tmpfs without one lets a run create
hundreds of thousands of empty files (kernel memory, and a long wipe). A root caller therefore mounts the
worker's /tmp and /dev/shm itself, with ``size`` and ``nr_inodes``, binds them into the sandbox, and
detaches them from the host as soon as the sandbox holds them: they then live exactly as long as the
sandbox's mount namespace, and no other host process sees them.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


class ScratchMounts:
    """Two tmpfs (``tmp`` and ``shm``) under a fresh host directory."""

    def __init__(self, size_bytes: int, inodes: int) -> None:
        self.root = tempfile.mkdtemp(prefix="forge-sandbox-mnt-")
        self.mounted: list[str] = []
        try:
            for name in ("tmp", "shm"):
                path = os.path.join(self.root, name)
                os.mkdir(path)
                options = f"size={size_bytes},nr_inodes={inodes},mode=1777".encode()
                if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, options) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"cannot mount a tmpfs on {path}: {os.strerror(err)}")
                self.mounted.append(path)
        except BaseException:
            self.detach()
            raise

    @property
    def tmp(self) -> str:
        return os.path.join(self.root, "tmp")

    @property
    def shm(self) -> str:
        return os.path.join(self.root, "shm")

    def detach(self) -> None:
        """Remove the mounts from the host (a sandbox that binds them keeps them) and the directory."""
        for path in self.mounted:
            _libc.umount2(path.encode(), MNT_DETACH)
        self.mounted = []
        shutil.rmtree(self.root, ignore_errors=True)


def can_mount() -> bool:
    return os.geteuid() == 0
