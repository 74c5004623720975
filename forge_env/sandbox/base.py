"""The sandbox contract: limits, the result of one execution, the ``Sandbox`` protocol and its errors.

Backends (``process``, ``docker``) implement :class:`Sandbox`; environments and tools only see this module.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

from forge_env.errors import InfraError


class SandboxError(InfraError):
    """Base class of sandbox failures (not of failures of the code it runs: those are ExecResults).

    A failure of the sandbox is a failure of the machine: an :class:`~forge_env.errors.InfraError`
    (and still a ``RuntimeError``), so an episode it ends is masked as ``infra_error``.
    """


class SandboxUnavailableError(SandboxError):
    """The requested isolation cannot be set up on this machine."""


class SandboxClosedError(SandboxError):
    """The sandbox (or session) was closed; create a new one."""


class SandboxBusyError(SandboxError):
    """Too many sessions are open at once; close one or raise ``max_sessions``."""


class InvalidFilesError(ValueError):
    """A ``files`` mapping names a path outside the working directory or holds a non-text/bytes value."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to every execution (and to every call of a session).

    ``memory_mb`` bounds each process's address space (and, where memory cgroups can be used, a worker's
    whole memory is bounded by ``memory_mb + 2 * workdir_size_mb + 128`` MB); ``max_processes`` bounds
    processes and threads alive at once; ``workdir_size_mb`` bounds everything a run writes (its
    directory, /tmp, /dev/shm), which is wiped after the run; ``max_files`` bounds the files and
    directories in each of those file systems (where the backend can set it: see docs/sandbox.md).
    """

    cpu_seconds: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 32
    file_size_mb: int = 16
    open_files: int = 64
    wall_timeout_s: float = 10.0
    max_output_bytes: int = 64 * 1024
    workdir_size_mb: int = 64
    max_files: int = 4096

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"SandboxLimits.{spec.name} must be a positive number, got {value!r}")
        if self.open_files < 8:
            raise ValueError(f"SandboxLimits.open_files must be at least 8 (stdio and the interpreter), "
                             f"got {self.open_files}")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxLimits.memory_mb must be at least 64 (the interpreter's own address "
                             f"space), got {self.memory_mb}")

    def replace(self, **changes: float) -> SandboxLimits:
        """A copy with some limits changed; unknown names raise TypeError listing the valid ones."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown sandbox limit(s) {sorted(unknown)}; valid: {limit_names()}")
        return dataclasses.replace(self, **changes)

    def to_wire(self) -> dict[str, float]:
        """The limits as the fork server reads them (computed once: the dataclass is frozen)."""
        wire = self.__dict__.get("_wire")
        if wire is None:
            wire = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
            object.__setattr__(self, "_wire", wire)
        return wire


def limit_names() -> list[str]:
    """Names of the fields of :class:`SandboxLimits`."""
    return [f.name for f in dataclasses.fields(SandboxLimits)]


@dataclass
class ExecResult:
    """What one execution produced.

    ``exit_code`` is the process's exit status (negative: killed by that signal; None: no status, e.g.
    the sandbox itself failed). ``killed_reason`` says why it did not finish normally: "timeout" (wall
    clock), "cpu", "memory", "output_limit" (output past ``max_output_bytes``, which is truncated),
    "signal:SIGSEGV" and the like, or "sandbox_error"; None when it ran to its own end.
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    killed_reason: str | None = None
    duration_s: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """The program exited by itself with status 0."""
        return self.exit_code == 0 and self.killed_reason is None

    def summary(self, max_chars: int = 2000) -> str:
        """A short human/LLM-readable account: status line, then stdout and stderr (each clipped)."""
        if self.killed_reason == "timeout":
            status = f"timed out after {self.duration_s:.1f}s"
        elif self.killed_reason:
            status = f"killed ({self.killed_reason})"
        else:
            status = f"exit code {self.exit_code}"
        parts = [status]
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text:
                clipped = text if len(text) <= max_chars else text[:max_chars // 2] + "\n...\n" + text[-max_chars // 2:]
                parts.append(f"{name}:\n{clipped}")
        return "\n".join(parts)


@runtime_checkable
class SandboxSession(Protocol):
    """A persistent interpreter: variables and files survive between calls; limits apply per call."""

    async def run(self, code: str, *, stdin: str | bytes | None = None,
                  files: Mapping[str, str | bytes] | None = None, timeout: float | None = None) -> ExecResult: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> SandboxSession: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """Runs untrusted Python: ``await sandbox.run(code)`` in a fresh, limited, network-less process.

    ``prelude`` is trusted setup code run once per worker whose globals every run starts with (see
    ``PooledSandbox.run``); backends without workers may simply run it before ``code``.
    """

    limits: SandboxLimits

    async def run(self, code: str, *, stdin: str | bytes | None = None,
                  files: Mapping[str, str | bytes] | None = None, timeout: float | None = None,
                  prelude: str | None = None) -> ExecResult: ...

    def session(self) -> SandboxSession: ...

    async def close(self) -> None: ...


def check_files(files: Mapping[str, str | bytes] | None) -> dict[str, bytes]:
    """Validate a ``files`` mapping (relative paths inside the working directory) and encode its values."""
    if files is None:
        return {}
    if not isinstance(files, Mapping):
        raise InvalidFilesError(f"files must be a mapping of relative path -> str|bytes, got {type(files).__name__}")
    checked: dict[str, bytes] = {}
    for name, content in files.items():
        if not isinstance(name, str) or not name or "\0" in name:
            raise InvalidFilesError(f"file name {name!r} must be a non-empty string")
        normal = os.path.normpath(name)
        if os.path.isabs(name) or normal == "." or normal.startswith(".."):
            raise InvalidFilesError(f"file name {name!r} must be a relative path inside the working directory")
        if isinstance(content, str):
            content = content.encode()
        elif not isinstance(content, bytes | bytearray):
            raise InvalidFilesError(f"file {name!r} must be str or bytes, got {type(content).__name__}")
        checked[normal] = bytes(content)
    return checked


def as_bytes(stdin: str | bytes | None) -> bytes | None:
    """Encode a ``stdin`` argument (str is UTF-8 encoded)."""
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    if isinstance(stdin, bytearray):
        return bytes(stdin)
    if isinstance(stdin, str):
        return stdin.encode()
    raise TypeError(f"stdin must be str, bytes or None, got {type(stdin).__name__}")
