"""``make_sandbox``: build a sandbox backend by name, splitting limit keywords from backend options."""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from forge_env.sandbox.base import Sandbox, SandboxLimits, limit_names


def _loader(module: str, name: str) -> Callable[[], type[Sandbox]]:
    return lambda: getattr(importlib.import_module(module), name)


#: Backend name -> a loader of its class, imported only when chosen (the docker SDK is heavy). A third-party
#: backend joins with :func:`register_sandbox`.
SANDBOX_BACKENDS: dict[str, Callable[[], type[Sandbox]]] = {
    "process": _loader("forge_env.sandbox.process", "ProcessSandbox"),
    "docker": _loader("forge_env.sandbox.docker", "DockerSandbox"),
}
BACKENDS = tuple(SANDBOX_BACKENDS)


def register_sandbox(name: str, loader: Callable[[], type[Sandbox]]) -> None:
    """Make ``make_sandbox(name, ...)`` build ``loader()(limits, **options)``."""
    global BACKENDS
    SANDBOX_BACKENDS[name] = loader
    BACKENDS = tuple(SANDBOX_BACKENDS)


def make_sandbox(backend: str = "process", *, limits: SandboxLimits | None = None, **options: Any) -> Sandbox:
    """Create a sandbox.

    Keyword arguments named like :class:`SandboxLimits` fields (``cpu_seconds``, ``memory_mb``,
    ``max_processes``, ``file_size_mb``, ``open_files``, ``wall_timeout_s``, ``max_output_bytes``,
    ``workdir_size_mb``) override ``limits``; the rest go to the backend (``max_concurrency``,
    ``isolation``, ``image``, the process backend's ``packages`` allow-list, ...).
    """
    names = set(limit_names())
    overrides = {key: options.pop(key) for key in list(options) if key in names}
    limits = (limits or SandboxLimits()).replace(**overrides)
    if backend not in SANDBOX_BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {tuple(SANDBOX_BACKENDS)}")
    backend_class = SANDBOX_BACKENDS[backend]()
    accepted = set(inspect.signature(backend_class.__init__).parameters) - {"self", "limits"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(f"unknown sandbox option(s) {unknown} for the {backend!r} backend; limits: "
                        f"{sorted(names)}; backend options: {sorted(accepted)}")
    return backend_class(limits, **options)


_shared: dict[tuple[str, str], Sandbox] = {}
_shared_lock = threading.Lock()


def shared_sandbox(backend: str = "process", **options: Any) -> Sandbox:
    """The process-wide sandbox of a backend (default limits and ``options``), created on first use.

    Environments use it unless given one (``shared_sandbox()``: the ``process`` backend; Coding-v0's
    ``sandbox_backend="docker"``: the docker one), so many environment instances share one pool of
    workers. Its workers are stopped when the interpreter exits. One instance per backend and options.
    """
    key = (backend, repr(sorted(options.items())))
    with _shared_lock:
        sandbox = _shared.get(key)
        if sandbox is None or getattr(sandbox, "_closed", False):
            sandbox = _shared[key] = make_sandbox(backend, **options)
        return sandbox
