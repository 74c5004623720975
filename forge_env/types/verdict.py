"""``Verdict``: the one grading-result noun of forge-env.

Whatever grades an episode's work returns a :class:`Verdict`: a rubric scoring a final answer
(:meth:`Rubric.score <forge_env.core.rubric.Rubric.score>`; ``RubricResult`` is its old name), an
environment's :meth:`TextEnv.grade_episode <forge_env.core.env.TextEnv.grade_episode>` (SWE-v0's hidden
tests, Terminal-v0's verifier, a verifiers taskset's rubric), Math-v0's answer check. ``TextEnv`` turns it
into the step's reward, ``info["metrics"]`` and the episode's ``info["episode_summary"]`` in one place.

A grader with more to say than these fields subclasses it (Math-v0's ``AnswerVerdict`` adds the answers it
compared). Records that are *inputs* to a verdict stay their own nouns and say so: Coding-v0's
``CheckReport`` (one solution's per-test outcomes) and SWE-v0's ``Grade`` (the grading run's per-test
statuses, dropped files and canaries) are what a grader reads to decide a verdict, not the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    """What grading decided.

    Attributes:
        reward: the reward the work earns.
        metrics: named numbers reported with it (``info["metrics"]``, the episode's metrics).
        passed: the work is right (a correct answer, a resolved task); what ``passed`` means beyond the
            reward is the grader's to say.
        status: why, in a word (``"correct"``, ``"wrong"``, ``"timeout"``, ...), when the grader says.
        detail: what a person should know (an error, the reason the reward is 0), when there is something.
        seconds: how long grading took.
        summary: entries for the episode's ``info["episode_summary"]`` (the grader's own record).
        info: entries for the ending step's ``info`` (e.g. Terminal-v0's ``verifier_output``).
    """

    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    passed: bool = False
    status: str = ""
    detail: str = ""
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
