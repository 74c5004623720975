"""Looking at an actor class's Monarch endpoints: names, the plain method behind each, signatures.

Shared by the service (to validate endpoint names and to decide whether an endpoint
takes the call's ``session_id``) and by the in-process backend (to call the method).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from monarch._src.actor.endpoint import EndpointProperty

# Set by monarch.actor.concurrent_endpoint on its wrapper; the wrapped original is in __wrapped__.
_CONCURRENT_WRAPPER_ATTR = "_monarch_concurrent_endpoint_wrapper"


@functools.cache
def endpoint_names(actor_class: type) -> frozenset[str]:
    """Names of the class's endpoints (public ones; ``_forge_*`` internals excluded)."""
    return frozenset(name for name in dir(actor_class)
                     if isinstance(getattr(actor_class, name, None), EndpointProperty) and not name.startswith("_forge"))


def _plain_method(actor_class: type, name: str) -> tuple[Callable[..., Any], bool, bool]:
    """(function behind endpoint ``name``, is it a ``@concurrent_endpoint``, does it take an explicit response port)."""
    prop = getattr(actor_class, name, None)
    if not isinstance(prop, EndpointProperty):
        raise AttributeError(unknown_endpoint_message(actor_class, name))
    method = prop._method
    if getattr(method, _CONCURRENT_WRAPPER_ATTR, False):
        return method.__wrapped__, True, False
    return method, False, prop._explicit_response_port


def is_concurrent_endpoint(actor_class: type, name: str) -> bool:
    """Whether endpoint ``name`` is a ``@concurrent_endpoint`` (its calls may run side by side)."""
    return _plain_method(actor_class, name)[1]


@functools.cache
def endpoint_method(actor_class: type, name: str) -> tuple[Callable[..., Any], bool]:
    """The plain function behind endpoint ``name`` and whether it is a ``@concurrent_endpoint``."""
    method, concurrent, explicit_port = _plain_method(actor_class, name)
    if explicit_port:
        raise NotImplementedError(
            f"{actor_class.__qualname__}.{name} uses explicit_response_port, which the local backend does not "
            "support; use backend='monarch'")
    return method, concurrent


@functools.cache
def accepts_parameter(actor_class: type, name: str, parameter: str) -> bool:
    """Whether endpoint ``name`` declares a parameter called ``parameter``."""
    method, _, _ = _plain_method(actor_class, name)
    return parameter in inspect.signature(method).parameters


def accepts_session_id(actor_class: type, name: str) -> bool:
    """Whether endpoint ``name`` declares a ``session_id`` parameter (then sticky calls pass it their session id)."""
    return accepts_parameter(actor_class, name, "session_id")


def unknown_endpoint_message(actor_class: type, name: str) -> str:
    known = ", ".join(sorted(endpoint_names(actor_class))) or "none"
    return (f"{actor_class.__qualname__} has no endpoint {name!r} (endpoints: {known}); "
            "decorate the method with @endpoint")
