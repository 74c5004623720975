"""The errors of the :class:`~forge_env.core.env.TextEnv` contract, and its records re-exported.

``EpisodeState`` (what an environment knows of the running episode), ``AnswerOutcome`` (what its
``on_final_answer`` decides), ``EpisodeEnd`` (how an episode ended) and ``Task`` are nouns of
:mod:`forge_env.types`, re-exported here. The errors are raised for misuse of an environment (stepping before a reset or after the end, a task without
the needed fields), never for a bad action, which becomes an observation. All are re-exported by
:mod:`forge_env.core.env` and by ``forge_env``.
"""

from __future__ import annotations

from forge_env.types.episode import AnswerOutcome, EndKind, EpisodeEnd, EpisodeState, Task

__all__ = ["AnswerOutcome", "EndKind", "EnvError", "EpisodeEnd", "EpisodeEndedError", "EpisodeState", "ResetNeededError",
           "Task", "TaskError"]


class EnvError(RuntimeError):
    """Base class for misuse of an environment (not for bad actions, which become observations)."""


class ResetNeededError(EnvError):
    """``step`` was called before ``reset``."""


class EpisodeEndedError(EnvError):
    """``step`` was called after the episode terminated or was truncated; call ``reset`` first."""


class TaskError(ValueError):
    """A task passed through ``reset(options={"task": ...})`` does not have the fields this environment needs."""
