"""The records and errors of the :class:`~forge_env.core.env.TextEnv` contract.

``EpisodeState`` is what an environment knows of the running episode, ``AnswerOutcome`` what its
``on_final_answer`` decides; the errors are raised for misuse of an environment (stepping before a reset or
after the end, a task without the needed fields), never for a bad action, which becomes an observation.
All are re-exported by :mod:`forge_env.core.env` and by ``forge_env``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forge_env.types import Message

Task = dict[str, Any]


class EnvError(RuntimeError):
    """Base class for misuse of an environment (not for bad actions, which become observations)."""


class ResetNeededError(EnvError):
    """``step`` was called before ``reset``."""


class EpisodeEndedError(EnvError):
    """``step`` was called after the episode terminated or was truncated; call ``reset`` first."""


class TaskError(ValueError):
    """A task passed through ``reset(options={"task": ...})`` does not have the fields this environment needs."""


@dataclass
class EpisodeState:
    """Everything an environment knows about the running episode. ``data`` is free for subclasses."""

    task: Task
    messages: list[Message] = field(default_factory=list)
    turn: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    format_errors: int = 0
    chars: int = 0
    total_reward: float = 0.0
    done: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    released: bool = False


@dataclass
class AnswerOutcome:
    """What :meth:`TextEnv.on_final_answer` decides: the reward, whether the episode ends, and any reply."""

    reward: float
    done: bool = True
    messages: list[Message] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

