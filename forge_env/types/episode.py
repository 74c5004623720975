"""The nouns of one running episode in an environment: its task, its state, and what a final answer decides.

``Task`` is a plain dict (a dataset row: the prompt's fields and whatever grading needs). ``EpisodeState``
is what a :class:`~forge_env.core.env.TextEnv` knows of the running episode, ``AnswerOutcome`` what its
``on_final_answer`` decides. Re-exported by :mod:`forge_env.types`, :mod:`forge_env.core.env` and ``forge_env``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forge_env.types.messages import Message

Task = dict[str, Any]


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

