"""Concrete environments built on forge_env."""
def register_environments() -> None:
    """Entry point of the `forge_env.environments` group: registers every built-in environment."""

