"""Concrete environments built on forge_env."""


def register_environments() -> None:
    """Entry point of the `forge_env.environments` group: registers every built-in environment."""
    from forge_env.core.registry import register, register_namespace

    register("forge_env/Math-v0", "environments.math.env:MathEnv",
             description="math word problems (GSM8K sample by default) graded with math-verify")
    register("forge_env/Arithmetic-v0", "environments.arithmetic.env:ArithmeticEnv",
             description="seeded arithmetic with a calculator tool, for tiny models")
    register("forge_env/ToolUse-v0", "environments.tool_use.env:ToolUseEnv",
             description="multi-hop questions over a seeded synthetic knowledge base: search, read, calculator")
    register("forge_env/Coding-v0", "environments.coding.env:CodingEnv",
             description="Python tasks (HumanEval style, assert lists, stdin/stdout) checked in the sandbox, "
                         "with test feedback")
    register("forge_env/SWE-v0", "environments.swe.env:SWEEnv",
             description="repository-level tasks (SWE-bench rows): a shell in a per-episode sandboxed checkout, "
                         "graded by the repository's hidden tests")
    register("forge_env/Terminal-v0", "environments.terminal.env:TerminalEnv",
             description="Harbor / Terminal-Bench task directories: a bash tool in the task's container, "
                         "verified by its tests in a fresh container from the agent's final file system")
    register_namespace("verifiers", "environments.verifiers_env:load_verifiers_env",
                       description="an installed verifiers taskset (verifiers 0.4, `verifiers.v1`) played as a TextEnv: "
                                   "its rows are tasks, its toolsets tools, its rewards the episode reward")
