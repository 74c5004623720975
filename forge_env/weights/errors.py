"""Errors of the weight hand-off (no torch here: ``forge_env.generation`` imports this cheaply)."""

from __future__ import annotations


class WeightsError(RuntimeError):
    """Base class of the weight hand-off's errors."""


class WeightStoreError(WeightsError):
    """The weight store cannot do what was asked (missing version, unusable backend, bad data)."""


class WeightPushGone(WeightStoreError):
    """A version being relayed while it was pushed will not complete (its push died, or its slot was taken
    for another write): what arrived of it cannot be kept, so its next pull starts from the beginning."""


class WeightVersionNotFound(WeightStoreError, LookupError):
    """The requested version is not in the store (never pushed, or already dropped)."""


class WeightMismatchError(WeightsError, ValueError):
    """Weights do not fit the model they are meant for (names, shapes, dtypes); nothing was loaded."""


class WeightSourceError(WeightsError, TypeError):
    """An object given as a weight source is not one (neither callable nor has ``get(version)``)."""
