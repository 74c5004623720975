"""Weight sources for the generator service tests (module level, so replica processes can import them)."""

from forge_env.models import build_tiny_model


def tiny_weights(version: int) -> dict:
    """Version ``v`` of the weights is the tiny model initialised with seed ``v``."""
    return build_tiny_model(seed=version).state_dict()
