"""The training sample: what the RL core consumes (re-exported by :mod:`forge_env.rl.types`).

A ``TrainSample`` is one token-exact episode (or one completion) ready for a trainer:
the whole token sequence (prompt, sampled tokens, env/template tokens of later turns),
a loss mask that is 1 exactly on the tokens the policy sampled, the sampler's logprobs
aligned with the tokens, an advantage, and the policy versions that produced it.

Trajectories (:mod:`forge_env.types.trajectory`) convert into this type; the replay
buffer, advantage functions and trainers work only on it, so the RL core does not depend
on how episodes were collected. Plain Python lists keep it cheap to pickle across Monarch
processes and trivially JSON-serialisable.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any


class MessageLevelTrajectoryError(ValueError):
    """A message-level episode (from a chat API) was offered for training; it has no tokens to train on."""


class InvalidSampleError(ValueError):
    """A TrainSample whose fields are inconsistent (lengths, mask values, first token sampled, ...)."""


@dataclass
class TrainSample:
    """One token-exact sequence with everything a policy-gradient loss needs.

    Alignment: ``old_logprobs[i]`` (and ``ref_logprobs[i]``) is the log-probability of
    ``token_ids[i]`` given ``token_ids[:i]``. ``old_logprobs`` is 0.0 where ``loss_mask``
    is 0 (the sampler did not produce those tokens); ``ref_logprobs`` may hold values on
    every token. Only positions with ``loss_mask == 1`` ever reach a loss. Token 0 has no
    prediction, so it can never be a sampled token.
    """

    token_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float = 0.0
    reward: float = 0.0
    ref_logprobs: list[float] | None = None
    policy_versions: list[int] = field(default_factory=list)
    """Policy version of each assistant turn, in order (one entry per turn)."""
    turn_spans: list[list[int]] = field(default_factory=list)
    """``[start, end)`` token span of each assistant turn, aligned with ``policy_versions`` (empty: not
    recorded; every sampled token then counts as the oldest turn's). With partial rollouts one episode's
    turns come from several policy versions: :meth:`token_policy_versions` gives each token its own."""
    group_id: str | None = None
    """Samples from the same prompt share a group id (GRPO groups)."""
    episode_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable extras (truncation reason, task id, per-turn rewards, ...)."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def min_policy_version(self) -> int:
        """Version of the oldest turn: an episode is as stale as its oldest part (0 when unknown)."""
        return min(self.policy_versions) if self.policy_versions else 0

    def token_policy_versions(self) -> list[int | None]:
        """The policy version that sampled each token (None where ``loss_mask`` is 0)."""
        versions: list[int | None] = [None] * len(self.token_ids)
        if self.turn_spans:
            for (start, end), version in zip(self.turn_spans, self.policy_versions, strict=True):
                versions[start:end] = [version] * (end - start)
        else:
            versions = [self.min_policy_version if m else None for m in self.loss_mask]
        return [v if m else None for v, m in zip(versions, self.loss_mask, strict=True)]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        """How many tokens the loss is computed on (the sampled ones)."""
        return sum(self.loss_mask)

    def validate(self) -> None:
        """Raise ``InvalidSampleError`` if the fields do not line up."""
        n = len(self.token_ids)
        if n == 0:
            raise InvalidSampleError("TrainSample.token_ids is empty; a sample needs at least a prompt token")
        if len(self.loss_mask) != n:
            raise InvalidSampleError(f"loss_mask has {len(self.loss_mask)} entries for {n} tokens; they must align")
        if len(self.old_logprobs) != n:
            raise InvalidSampleError(
                f"old_logprobs has {len(self.old_logprobs)} entries for {n} tokens; "
                "pad with 0.0 on prompt/env tokens so they align with token_ids"
            )
        if self.ref_logprobs is not None and len(self.ref_logprobs) != n:
            raise InvalidSampleError(f"ref_logprobs has {len(self.ref_logprobs)} entries for {n} tokens")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise InvalidSampleError("loss_mask must contain only 0 and 1")
        if self.loss_mask[0]:
            raise InvalidSampleError(
                "loss_mask[0] is 1, but the first token has no prediction; a sample must start with prompt tokens"
            )
        if self.turn_spans:
            if len(self.turn_spans) != len(self.policy_versions):
                raise InvalidSampleError(f"turn_spans has {len(self.turn_spans)} entries for "
                                         f"{len(self.policy_versions)} policy_versions; one span per turn")
            last = 0
            for span in self.turn_spans:
                if len(span) != 2 or not last <= span[0] <= span[1] <= n:
                    raise InvalidSampleError(f"turn span {span} is out of order or outside the {n} tokens")
                last = span[1]
        if not math.isfinite(self.advantage) or not math.isfinite(self.reward):
            raise InvalidSampleError(f"advantage ({self.advantage}) and reward ({self.reward}) must be finite")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable) with every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainSample:
        """Inverse of ``to_dict``; unknown keys are an error so schema drift is caught."""
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise InvalidSampleError(f"unknown TrainSample fields {sorted(unknown)}; expected a subset of {sorted(known)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> TrainSample:
        return cls.from_dict(json.loads(text))
