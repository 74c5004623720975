"""Registering environments by id, and making them.

``register(id, entry_point, **defaults)`` records how to build an environment;
``make(id, **kwargs)`` builds one. Every id is registered with gymnasium too, so
``gymnasium.make(id)`` works (a plugin's ids once the plugins are loaded: after any lookup here, or
:func:`load_plugins`; gymnasium has no hook to load them on its own lookup). Third-party packages add environments through the
entry-point group ``forge_env.environments``: each entry point names a function
that calls :func:`register`. Entry points are loaded once, on first lookup, so
``import forge_env`` stays fast and the SDK never imports an environment package
by name.

A *namespace* covers a whole family of ids that no list could hold, such as every
installed package of another ecosystem: ``register_namespace("verifiers", factory)``
makes ``make("verifiers:<name>", **kwargs)`` call ``factory("<name>", **kwargs)``.
The factory is resolved lazily like an entry point, so the package behind it is
imported only when such an id is made. Namespaced ids are not bridged to
``gymnasium.make`` (gymnasium reads ``"module:EnvId"`` as a module to import).
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import gymnasium

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "forge_env.environments"


class UnknownEnvironmentError(KeyError):
    """No environment is registered under that id."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class EnvSpec:
    """How to build a registered environment: its entry point ("module:Class" or a callable) and default kwargs."""

    id: str
    entry_point: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def load(self) -> Any:
        """The class or factory named by the entry point."""
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attribute = self.entry_point.partition(":")
        if not attribute:
            raise ValueError(f"entry point {self.entry_point!r} of {self.id} must look like 'package.module:ClassName'")
        return getattr(importlib.import_module(module_name), attribute)


_registry: dict[str, EnvSpec] = {}
_namespaces: dict[str, EnvSpec] = {}
_plugins_loaded = False
_plugins_lock = threading.RLock()


def register(id: str, entry_point: Any, *, description: str = "", **defaults: Any) -> EnvSpec:
    """Register an environment id; ``defaults`` are keyword arguments that ``make`` passes unless overridden."""
    spec = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(defaults), description=description)
    _registry[id] = spec
    if id in gymnasium.registry:
        del gymnasium.registry[id]
    gymnasium.register(id=id, entry_point=entry_point, kwargs=dict(defaults), disable_env_checker=True)
    return spec


def register_namespace(prefix: str, factory: Any, *, description: str = "") -> EnvSpec:
    """Make every id ``"<prefix>:<name>"`` buildable: ``make`` calls ``factory(name, **kwargs)``.

    ``factory`` is a callable or ``"package.module:function"`` (imported on first use). The prefix is
    a plain word: no ``:`` or ``/``, so it cannot shadow a registered id.
    """
    if not prefix or not prefix.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"a namespace prefix is a plain word (letters, digits, -_.), got {prefix!r}")
    spec = EnvSpec(id=f"{prefix}:", entry_point=factory, description=description)
    _namespaces[prefix] = spec
    return spec


def namespaces() -> dict[str, EnvSpec]:
    """All registered namespaces by prefix (plugins included)."""
    load_plugins()
    return dict(_namespaces)


def _namespaced_spec(id: str) -> EnvSpec | None:
    prefix, colon, name = id.partition(":")
    if not colon or prefix not in _namespaces:
        return None
    if not name.strip():
        raise UnknownEnvironmentError(f"{id!r} names no environment: write {prefix}:<name>")
    namespace = _namespaces[prefix]
    factory = namespace.load()
    return EnvSpec(id=id, entry_point=functools.partial(factory, name), description=namespace.description)


def load_plugins() -> None:
    """Run every ``forge_env.environments`` entry point once (they call :func:`register`)."""
    global _plugins_loaded
    with _plugins_lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()()
            except Exception:  # one broken plugin must not hide the others
                logger.exception("forge_env: environment plugin %r failed to load", ep.name)


def specs() -> dict[str, EnvSpec]:
    """All registered environments by id (plugins included)."""
    load_plugins()
    return dict(_registry)


def spec(id: str) -> EnvSpec:
    """The spec registered under ``id``; raise UnknownEnvironmentError with close matches otherwise."""
    load_plugins()
    try:
        return _registry[id]
    except KeyError:
        import difflib

        namespaced = _namespaced_spec(id)
        if namespaced is not None:
            return namespaced
        close = difflib.get_close_matches(id, list(_registry), n=3)
        hint = f" Did you mean {close}?" if close else f" Registered: {sorted(_registry)}"
        if _namespaces:
            hint += f" Namespaces: {', '.join(f'{p}:<name>' for p in sorted(_namespaces))}."
        raise UnknownEnvironmentError(f"no environment registered as {id!r}.{hint}") from None


def make(id: str, **kwargs: Any) -> Any:
    """Build the environment registered as ``id``; ``kwargs`` override its registered defaults."""
    env_spec = spec(id)
    env = env_spec.load()(**{**env_spec.kwargs, **kwargs})
    env.spec_id = id
    return env
