"""The nouns of one running episode in an environment: its task, its state, and what a final answer decides.

``Task`` is a plain dict (a dataset row: the prompt's fields and whatever grading needs). ``EpisodeState``
is what a :class:`~forge_env.core.env.TextEnv` knows of the running episode, ``AnswerOutcome`` what its
``on_final_answer`` decides, ``EpisodeEnd`` how an episode ended (what ``grade_episode`` is told). Re-exported by :mod:`forge_env.types`, :mod:`forge_env.core.env` and ``forge_env``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from forge_env.types.messages import Message
from forge_env.types.verdict import Verdict

Task = dict[str, Any]


@dataclass
class EpisodeState:
    """Everything an environment knows about the running episode. ``data`` is free for subclasses.

    ``end_request`` is set by :meth:`request_end` (a tool that submits calls it); ``verdict`` is the episode's
    grade once :meth:`TextEnv.grade_episode <forge_env.core.env.TextEnv.grade_episode>` has given one.
    """

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
    end_request: str | None = None
    verdict: Verdict | None = None

    def request_end(self, reason: str = "submitted") -> None:
        """End the episode after the current turn (``terminated``), graded by ``grade_episode``: what a tool
        that submits the work calls. The request wins over a limit reached on the same turn."""
        self.end_request = reason


EndKind = Literal["answer", "request", "stop", "limit"]


@dataclass(frozen=True)
class EpisodeEnd:
    """How an episode ended, as :meth:`TextEnv.grade_episode <forge_env.core.env.TextEnv.grade_episode>` is told.

    ``kind``: ``"answer"`` (a final answer, reason ``"final_answer"``), ``"request"`` (a tool called
    :meth:`EpisodeState.request_end`; the reason it gave), ``"stop"`` (:meth:`TextEnv.stop_condition` named
    a reason) or ``"limit"`` (``max_turns``, ``max_chars``, ``max_tokens`` cut it: the step is ``truncated``).
    """

    kind: EndKind
    reason: str

    @property
    def truncated(self) -> bool:
        return self.kind == "limit"


@dataclass
class AnswerOutcome:
    """What :meth:`TextEnv.on_final_answer` decides: the reward, whether the episode ends, and any reply."""

    reward: float
    done: bool = True
    messages: list[Message] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

