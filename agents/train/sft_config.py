"""The SFT warm-up's section of the GRPO application's configuration (``sft:``; re-exported by
:mod:`agents.train.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class SFTConfig:
    """Optional supervised warm-up on the environment's expert demonstrations before RL."""

    enabled: bool = False
    steps: int = 100
    batch_size: int = 16
    lr: float = 1e-3
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """``cosine``: a linear warm-up over the first 5% of steps, then cosine decay to 10% of ``lr``."""
    target_loss: float | None = None
    """Stop early once the loss (a running mean) reaches this; ``steps`` stays the limit. A small model
    learns to copy from its prompt abruptly, after a number of steps that varies from run to run."""
    num_demonstrations: int = 1000
    seed_start: int = 0
    """Demonstration ``i`` is the expert's episode on ``reset(seed=seed_start + i)``."""
    direct_answer_fraction: float = 0.0
    """Fraction of demonstrations rewritten to give the final answer straight away, without tool calls,
    so that RL has to discover that the tools pay off. Costly for a tiny model: the unlearnable direct
    answers slow down its learning to copy from the prompt unless ``direct_answer_loss`` is ``first_token``."""
    direct_answer_loss: Literal["full", "first_token"] = "full"
    """What a rewritten demonstration trains: ``full``, the whole direct answer; ``first_token``, only its
    first token, i.e. the choice to answer without tools, not the (unlearnable) number itself."""
    direct_answer_steps: int = 0
    """0: the rewrites are mixed into the whole warm-up. ``n > 0``: the warm-up (up to ``steps``, or to
    ``target_loss``) trains on the unmodified demonstrations, then ``n`` more steps on the mix, so that
    learning to use the tools is not slowed down and the final phase sets how often the model skips them."""

    target_tool_rate: float | None = None
    """With ``direct_answer_steps``: end that phase as soon as the model's probability of opening its first
    turn with a tool call (computed exactly on fixed prompts after every step) falls to this, the top of the
    band ``[min_tool_rate, target_tool_rate]`` (``agents.train.tool_gate``). Pins where RL starts on every
    machine; ``direct_answer_steps`` stays the limit, and ``direct_answer_fraction`` must be high enough
    (its equilibrium tool rate, ``1 - fraction``, below the target) for the rate to get there."""
    min_tool_rate: float | None = None
    """With ``target_tool_rate``: the band's floor. A mixed step that takes the rate below it is undone
    (weights and optimizer state restored) and retried at half the learning rate, so the phase cannot
    overshoot to a policy that never calls the tool (RL would see no reward to compare)."""
    direct_answer_lr: float | None = None
    """The mixed phase's learning rate (default ``lr``; with a schedule it scales it by ``direct_answer_lr / lr``)."""
    full_weights: bool = False
    """With ``trainer.config.lora``: the warm-up trains every weight (as without LoRA), and the adapter is
    attached after it, for RL, on top of the warmed-up base (frozen). The generators get that base once, in
    a full push, then the adapter alone; the checkpoints keep it once (``checkpoints/base/``). False: the
    warm-up trains the adapter alone on the model as loaded (fine for a pre-trained model; the demo's tiny
    random model does not learn that way)."""

    def __post_init__(self) -> None:
        if self.target_tool_rate is not None and not 0.0 < self.target_tool_rate < 1.0:
            raise ValueError(f"target_tool_rate must be in (0, 1), got {self.target_tool_rate}")
        if self.min_tool_rate is not None:
            if self.target_tool_rate is None:
                raise ValueError("min_tool_rate is the floor of the band that target_tool_rate tops: set both")
            if not 0.0 <= self.min_tool_rate < self.target_tool_rate:
                raise ValueError(f"min_tool_rate must be in [0, target_tool_rate={self.target_tool_rate}), "
                                 f"got {self.min_tool_rate}")
        if self.direct_answer_lr is not None and not self.direct_answer_lr > 0:
            raise ValueError(f"direct_answer_lr must be > 0, got {self.direct_answer_lr}")
        if not 0.0 <= self.direct_answer_fraction <= 1.0:
            raise ValueError(f"direct_answer_fraction must be in [0, 1], got {self.direct_answer_fraction}")
        if self.direct_answer_loss not in ("full", "first_token"):
            raise ValueError(f"direct_answer_loss must be 'full' or 'first_token', got {self.direct_answer_loss!r}")
        if self.direct_answer_steps < 0:
            raise ValueError(f"direct_answer_steps must be >= 0, got {self.direct_answer_steps}")
        if self.enabled and (self.steps < 1 or self.batch_size < 1 or self.num_demonstrations < 1):
            raise ValueError("an enabled SFT warm-up needs steps, batch_size and num_demonstrations >= 1")
