"""Concrete environments built on forge_env."""


def register_environments() -> None:
    """Entry point of the `forge_env.environments` group: registers every built-in environment."""
    from forge_env import register

    register("forge_env/ToolUse-v0", "environments.tool_use.env:ToolUseEnv",
             description="multi-hop questions over a seeded synthetic knowledge base: search, read, calculator")
