"""What the pooled sandbox knows of a worker: the ``Worker`` protocol and its failure, the decoding of a
worker's reply, the preludes and preloaded modules a worker keeps, and the last-resort kill of workers left
behind. The backends (``process``, ``docker``) implement ``Worker``; :mod:`forge_env.sandbox.pool` drives it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import shutil
from typing import Any, Protocol

from forge_env.sandbox.base import ExecResult, SandboxError

#: Extra seconds a worker gets to answer after a run's own deadline (killing and wiping take a moment).
REPLY_GRACE_S = 5.0


class WorkerFailure(SandboxError):
    """A worker died, hung or broke the protocol; it is replaced."""


class Worker(Protocol):
    """One fork server, reached through a request/response channel."""

    @property
    def alive(self) -> bool: ...

    @property
    def pids(self) -> list[int]: ...

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply; raise WorkerFailure when the worker cannot answer."""
        ...

    async def close(self) -> None: ...


def kill_pids(pids: set[int], paths: set[str] | None = None) -> None:
    """Last-resort cleanup (garbage collection or interpreter exit): SIGKILL whatever workers remain and
    remove their host directories."""
    for pid in list(pids):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    pids.clear()
    for path in list(paths or ()):
        shutil.rmtree(path, ignore_errors=True)
    if paths:
        paths.clear()


def result_from_reply(reply: dict[str, Any]) -> ExecResult:
    """Decode a server reply into an ExecResult (output is decoded as UTF-8, undecodable bytes replaced)."""
    return ExecResult(
        stdout=base64.b64decode(reply["stdout"]).decode("utf-8", errors="replace"),
        stderr=base64.b64decode(reply["stderr"]).decode("utf-8", errors="replace"),
        exit_code=reply["exit_code"],
        timed_out=bool(reply["timed_out"]),
        killed_reason=reply["killed_reason"],
        duration_s=float(reply["duration_s"]),
        truncated=bool(reply["truncated"]),
    )


def error_result(message: str) -> ExecResult:
    return ExecResult(stderr=message, killed_reason="sandbox_error")


#: How many prelude texts a worker keeps (must match PRELUDES_KEPT in server/runs.py).
PRELUDES_KEPT = 16


@functools.lru_cache(maxsize=64)
def prelude_digest(text: str) -> str:
    """The name a prelude goes by after a worker has its text (sending 15 KB per run cost JSON work)."""
    return hashlib.sha256(text.encode()).hexdigest()


#: Modules imported once by each fork server so runs do not pay for them (children share the pages).
#: Kept short: every preloaded page makes each fork dearer, so only modules most programs import.
DEFAULT_PRELOAD: tuple[str, ...] = (
    "bisect", "collections", "functools", "heapq", "itertools", "json", "math", "random", "re", "string",
    "traceback", "typing",
)
