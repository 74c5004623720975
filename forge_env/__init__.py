"""forge-env: environments and agentic RL for language models.

The top level holds the environment contract and the nouns users hold (``Message``, ``Task``,
``Trajectory``: :mod:`forge_env.types`); heavier parts (sandbox, services, generation, rl, openenv) are
imported from their subpackages so ``import forge_env`` stays light. Importing it loads no plugin: the
``forge_env.environments`` entry points run on the first registry lookup (``make``, ``spec``, ``specs``,
``namespaces``) or an explicit :func:`load_plugins`.
"""

from forge_env.core.checker import EnvCheckError, check_env
from forge_env.core.env import (
    AnswerOutcome,
    EnvError,
    EpisodeEnd,
    EpisodeEndedError,
    EpisodeState,
    ResetNeededError,
    SnapshotError,
    TaskError,
    TextEnv,
    Verdict,
)
from forge_env.core.registry import (
    EnvSpec,
    UnknownEnvironmentError,
    load_plugins,
    make,
    namespaces,
    register,
    register_namespace,
    spec,
    specs,
)
from forge_env.core.rubric import Rubric, RubricResult
from forge_env.core.tool_env import ToolEnv, answer_matches
from forge_env.tools import InfraError, Tool, ToolArgumentError, ToolError, parse_tool_calls, tool
from forge_env.types import Message, Task, ToolCall, ToolSpec, Trajectory

__version__ = "0.1.0"

__all__ = [
    "AnswerOutcome", "EnvCheckError", "EnvError", "EnvSpec", "EpisodeEnd", "EpisodeEndedError", "EpisodeState", "InfraError", "Message",
    "ResetNeededError", "Rubric", "RubricResult", "SnapshotError", "Task", "TaskError", "TextEnv", "Tool", "ToolArgumentError",
    "ToolCall", "ToolEnv", "ToolError", "ToolSpec", "Trajectory", "UnknownEnvironmentError", "Verdict", "answer_matches",
    "check_env", "load_plugins", "make", "namespaces", "parse_tool_calls", "register", "register_namespace", "spec",
    "specs", "tool",
]
