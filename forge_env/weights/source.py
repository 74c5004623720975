"""Where generators fetch weights by version: the ``WeightSource`` contract (no torch import here).

A weight source is a callable ``version -> weights`` or an object with ``get(version)``
(``VersionedWeights``; ``WeightStore`` is one, and pickles to its settings, so it can be handed to
remote replicas). Weights are a state dict (or, for vLLM, the path of safetensors weights), a
``(weights, version)`` pair as ``WeightStore.get`` returns, or an awaitable of either.

A source that keeps every version in a safetensors file says so by implementing
``WeightFileSource.weights_path(version)`` (``WeightStore`` does; it answers ``None`` on a backend
without files). Readers that map files themselves (vLLM workers) ask it with ``weights_file`` and
take the file instead of a state dict. A bound method such as ``store.load`` is a plain callable
source: pass the store itself to let a generator read its files.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from forge_env.weights.errors import WeightSourceError


@runtime_checkable
class VersionedWeights(Protocol):
    """A weight source object: ``get(version)`` returns the weights (or ``(weights, version)``)."""

    def get(self, version: int) -> Any: ...


@runtime_checkable
class WeightFileSource(Protocol):
    """A weight source that can name the safetensors file holding a version."""

    def weights_path(self, version: int) -> Path | None:
        """The file holding ``version``, or ``None`` where this source has no files for it."""
        ...


#: What generators accept as ``weight_source`` (see the module docstring).
WeightSource = Callable[[int], Any] | VersionedWeights


async def fetch_weights(source: WeightSource, version: int) -> Any:
    """The weights of ``version`` from ``source``, unwrapped from a ``(weights, version)`` pair."""
    if callable(source):
        result = source(version)
    elif isinstance(source, VersionedWeights) and callable(source.get):
        result = source.get(version)
    else:
        raise WeightSourceError(f"weight source {source!r} is neither callable nor has get(version)")
    if inspect.isawaitable(result):
        result = await result
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], int):
        result = result[0]
    return result


def weights_file(source: WeightSource, version: int) -> Path | None:
    """The safetensors file of ``version`` when ``source`` is a ``WeightFileSource`` with files, else ``None``.

    Raises what the source raises for a version it does not hold (``WeightVersionNotFound``).
    """
    if isinstance(source, WeightFileSource):
        return source.weights_path(version)
    return None


@contextmanager
def held_weights_file(source: WeightSource, version: int) -> Iterator[Path | None]:
    """``weights_file(source, version)``, kept from being overwritten until the block ends.

    A store whose files are reused (the ring backend) implements ``hold(version)``; a reader that maps
    the file itself must read it inside this block (and may keep its mapping: that keeps the file too).
    """
    hold = getattr(source, "hold", None) if isinstance(source, WeightFileSource) else None
    if hold is None:
        yield weights_file(source, version)
        return
    with hold(version) as path:
        yield path
