"""Token-exact trajectories: what one episode of an agent against an environment produced.

The noun that joins environments to training (re-exported by :mod:`forge_env.types` and
:mod:`agents.trajectory`); the rollout loop that fills one lives in :mod:`agents.rollout`.

The token list is the conversation exactly as the model saw and wrote it. Sampled
tokens are the generator's own ids, kept verbatim (never re-tokenized); everything
else (the prompt, the env's replies, chat-template markup) comes from the renderer.
``loss_mask`` is 1 exactly on sampled tokens and ``logprobs`` holds the sampler's
logprob of each sampled token (0 elsewhere), aligned with ``token_ids``. Each turn
records its span and the policy version that sampled it.

Where the chat template would render the episode's messages differently from the tokens held (it
re-renders earlier turns: see ``forge_env.chat_drift``), each new divergence is recorded in ``drift``
with the turn it falls in; the tokens stay what the policy saw. A renderer with ``reasoning="rerender"``
starts a new context segment instead where the template drops earlier reasoning: ``segment_starts`` holds
where each segment begins, every segment is one training sequence (``to_samples``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from forge_env.types.messages import Message
from forge_env.types.sample import MessageLevelTrajectoryError, TrainSample

#: Episode statuses: finished normally, ended by an error in the env/generator, or ended because the
#: machine failed (a sandbox error, a dead replica, a tool or env held up past its deadline). Only
#: ``ok`` episodes are trained on: the others say nothing about the policy.
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_INFRA_ERROR = "infra_error"

#: ``Trajectory.error_kind`` of an episode ended by a model endpoint that failed for good (the model was never
#: asked, so it is not a model failure); other errors are ``"internal"``.
ERROR_ENDPOINT = "endpoint"
ERROR_INTERNAL = "internal"

#: ``Trajectory.level``: token-exact (trainable), or message-level from a chat API (evaluation only).
LEVEL_TOKEN = "token"
LEVEL_MESSAGE = "message"

#: ``Trajectory.drift`` kinds (found by ``forge_env.chat_drift``): the template drops reasoning the episode
#: keeps, or re-renders something else; or, not the template's doing, the model sampled a control token
#: (``<|endoftext|>``) inside its turn, which decoding drops.
REASONING_DROPPED = "reasoning_dropped"
RERENDERED = "rerendered"
CONTROL_TOKEN = "control_token"


@dataclass
class Turn:
    """One assistant turn: ``token_ids[prompt_start:gen_start]`` is what the renderer added before it
    (env replies + generation prompt), ``token_ids[gen_start:gen_end]`` what the generator sampled."""

    prompt_start: int
    gen_start: int
    gen_end: int
    policy_version: int
    finish_reason: str
    num_cached_tokens: int = 0
    reward: float = 0.0
    generation_s: float = 0.0
    env_s: float = 0.0


@dataclass
class Trajectory:
    """One episode, token-exact, JSON round-trippable (``to_json``/``from_json``)."""

    episode_id: str
    env_id: str = ""
    group_id: str = ""
    seed: int | None = None
    task: dict[str, Any] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    truncation_reason: str | None = None
    status: str = STATUS_OK
    error: str | None = None
    error_kind: str | None = None
    level: str = LEVEL_TOKEN
    """``"message"`` for episodes played through a chat API: messages only, no tokens, never trained on."""
    endpoint_retries: int = 0
    usage: dict[str, int] = field(default_factory=dict)
    """Token counts a chat API reported (``prompt_tokens``, ``completion_tokens``); message-level only."""
    metrics: dict[str, float] = field(default_factory=dict)
    drift: list[dict[str, Any]] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=lambda: [0])
    generation_s: float = 0.0
    env_s: float = 0.0
    total_s: float = 0.0

    # ------------------------------------------------------------------ building
    def append_context(self, ids: list[int]) -> None:
        """Add renderer tokens (prompt, env replies, template markup): not trained on."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def append_sampled(self, ids: list[int], logprobs: list[float]) -> None:
        """Add the generator's sampled tokens verbatim, with the sampler's logprobs."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled tokens but {len(logprobs)} logprobs")
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)

    def record_drift(self, drift: Any, offset: int = 0) -> dict[str, Any] | None:
        """Record a template divergence (a ``TemplateDrift`` at ``offset + drift.token_index``) unless the
        last record is the same one; return the record. ``turn`` is the turn whose span holds the token,
        ``where`` says whether it is in that turn's sampled tokens or in the context rendered before it."""
        index = offset + drift.token_index
        if self.drift and self.drift[-1]["token_index"] == index and self.drift[-1]["kind"] == drift.kind:
            return None
        turn, where = len(self.turns), "context"
        for number, span in enumerate(self.turns):
            if index < span.gen_start:
                turn, where = number, "context"
                break
            if index < span.gen_end:
                turn, where = number, "sampled"
                break
        record = {"turn": turn, "where": where, "token_index": index, "kind": drift.kind,
                  "held": drift.held, "rendered": drift.rendered, "detected_at_turn": len(self.turns) - 1}
        self.drift.append(record)
        return record

    def start_segment(self, ids: list[int]) -> None:
        """Begin a new context segment with ``ids`` (the re-rendered prompt): not trained on."""
        self.segment_starts.append(len(self.token_ids))
        self.append_context(ids)

    # ------------------------------------------------------------------ views
    @property
    def context_ids(self) -> list[int]:
        """The tokens the model sees next: the current segment."""
        return self.token_ids[self.segment_starts[-1]:]

    @property
    def drifted(self) -> bool:
        """Whether the template re-rendered this episode's tokens (a control token the model sampled
        inside a turn is recorded in ``drift`` too, but is the sample's doing, not the template's)."""
        return any(record["kind"] != CONTROL_TOKEN for record in self.drift)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def step_rewards(self) -> list[float]:
        return [turn.reward for turn in self.turns]

    @property
    def policy_versions(self) -> list[int]:
        return [turn.policy_version for turn in self.turns]

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    def sampled_ids(self, turn: int) -> list[int]:
        """The tokens the generator sampled in turn ``turn``."""
        span = self.turns[turn]
        return self.token_ids[span.gen_start:span.gen_end]

    def check(self) -> None:
        """Raise ValueError if the token-level invariants do not hold (aligned lists, mask == turn spans)."""
        n = len(self.token_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == n):
            raise ValueError(f"misaligned trajectory: {n} tokens, {len(self.loss_mask)} mask, {len(self.logprobs)} logprobs")
        expected = [0] * n
        for turn in self.turns:
            if not (0 <= turn.prompt_start <= turn.gen_start <= turn.gen_end <= n):
                raise ValueError(f"turn span out of order or out of range: {turn}")
            expected[turn.gen_start:turn.gen_end] = [1] * (turn.gen_end - turn.gen_start)
        if expected != self.loss_mask:
            raise ValueError("loss_mask is not exactly the sampled spans of the turns")

    def to_sample(self, advantage: float = 0.0) -> TrainSample:
        """The training sample of this episode: the same token list, mask and sampler logprobs (no re-tokenization).

        An episode of several context segments has one sample per segment: use :meth:`to_samples`.
        """
        self._check_trainable()
        if len(self.segment_starts) > 1:
            raise ValueError(f"episode {self.episode_id} has {len(self.segment_starts)} context segments; "
                             "use to_samples() (one training sequence per segment)")
        return self._sample(0, len(self.token_ids), advantage)

    def to_samples(self, advantage: float = 0.0) -> list[TrainSample]:
        """One training sample per context segment (one in all, unless ``reasoning="rerender"`` split it)."""
        self._check_trainable()
        bounds = [*self.segment_starts, len(self.token_ids)]
        return [self._sample(start, end, advantage) for start, end in zip(bounds, bounds[1:], strict=False)
                if any(self.loss_mask[start:end])]

    def _check_trainable(self) -> None:
        if not self.ok:
            raise ValueError(f"episode {self.episode_id} ended with status {self.status!r} ({self.error}); "
                             "only 'ok' episodes become training samples")
        if self.level == LEVEL_MESSAGE:
            raise MessageLevelTrajectoryError(
                f"episode {self.episode_id} is message-level (played through a chat API): it has no token ids, "
                "loss mask or sampler logprobs, so it cannot be trained on; use a token-level generator "
                "(in-process, or CompletionsGenerator over /v1/completions) for training data")

    def _sample(self, start: int, end: int, advantage: float) -> TrainSample:
        turns = [t for t in self.turns if start <= t.gen_start < end]
        versions = [t.policy_version for t in turns]
        spans = [[t.gen_start - start, t.gen_end - start] for t in turns]
        return TrainSample(
            token_ids=self.token_ids[start:end], loss_mask=self.loss_mask[start:end],
            old_logprobs=self.logprobs[start:end], advantage=advantage, reward=self.reward,
            policy_versions=versions, turn_spans=spans, group_id=self.group_id or None, episode_id=self.episode_id,
            metadata={"env_id": self.env_id, "level": self.level, "truncation_reason": self.truncation_reason,
                      "step_rewards": self.step_rewards, "status": self.status,
                      "template_drift": len(self.drift)})

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        fields = dict(data)
        fields["turns"] = [Turn(**turn) for turn in fields.get("turns", [])]
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Trajectory:
        return cls.from_dict(json.loads(text))


def write_jsonl(trajectories: list[Trajectory], path: str) -> None:
    """Write trajectories one JSON object per line."""
    with open(path, "w", encoding="utf-8") as out:
        for trajectory in trajectories:
            out.write(trajectory.to_json() + "\n")


def read_jsonl(path: str) -> list[Trajectory]:
    """Read trajectories written by :func:`write_jsonl`; a bad line is reported with its number."""
    trajectories = []
    with open(path, encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            if not line.strip():
                continue
            try:
                trajectories.append(Trajectory.from_json(line))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a trajectory ({exc})") from None
    return trajectories
