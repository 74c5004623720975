"""Sandboxed Python execution: ``make_sandbox("process" | "docker", **limits)`` and the ``Sandbox`` contract.

Example::

    from forge_env.sandbox import make_sandbox

    async with make_sandbox("process", cpu_seconds=5, memory_mb=512) as sandbox:
        result = await sandbox.run("print(sum(range(10)))")
        assert result.stdout == "45\\n"
        async with sandbox.session() as repl:
            await repl.run("x = 21")
            print((await repl.run("x * 2")).stdout)   # 42

Backends are imported lazily so ``import forge_env.sandbox`` stays cheap (the docker SDK in particular).
"""

from forge_env.sandbox.base import (
    ExecResult,
    InvalidFilesError,
    Sandbox,
    SandboxBusyError,
    SandboxClosedError,
    SandboxError,
    SandboxLimits,
    SandboxSession,
    SandboxUnavailableError,
)
from forge_env.sandbox.factory import make_sandbox, shared_sandbox
from forge_env.sandbox.hidden import hide_from_sandboxes


def __getattr__(name: str):
    # PythonREPL builds on forge_env.tools; importing it lazily keeps this package standard-library only
    # (besides forge_env/errors.py, a leaf module that imports nothing, for the InfraError base).
    if name == "PythonREPL":
        from forge_env.sandbox.repl import PythonREPL

        return PythonREPL
    raise AttributeError(f"module 'forge_env.sandbox' has no attribute {name!r}")


__all__ = [
    "ExecResult",
    "PythonREPL",
    "InvalidFilesError",
    "Sandbox",
    "SandboxBusyError",
    "SandboxClosedError",
    "SandboxError",
    "SandboxLimits",
    "SandboxSession",
    "SandboxUnavailableError",
    "hide_from_sandboxes",
    "make_sandbox",
    "shared_sandbox",
]
