"""The warm-up's last phase: bring the first-turn tool-call rate down into a band that leaves RL a signal.

After the first phase the model opens every first turn with a calculator call. The mixed phase trains
on demonstrations of which ``direct_answer_fraction`` answer straight away (only that choice is
trained), which lowers the probability of the tool-call token, until it lies in the band
``[min_tool_rate, target_tool_rate]``. Where RL starts is then a policy that sometimes uses the tool
(and is then right about half the time) and sometimes guesses (and is nearly always wrong): groups of
episodes with different rewards, RL's learning signal.

Stopping at the first step whose rate is at or below the target is not enough: with AdamW's momentum the
rate stays put for a few steps and then falls by tens of points in one step (measured: 92% -> 32% -> 9%
at lr 2e-4, and 100% -> 8% in a single step at 2e-3), and where that step lands depends on the CPU's
rounding. So every mixed step is checked: a step that takes the rate below ``min_tool_rate`` is undone
(weights, optimizer moments and schedule restored) and tried again with half the learning rate. The
rate is a continuous function of the weights, so a small enough step from a rate above the floor stays
above it: the phase ends inside the band, or (after ``direct_answer_steps`` steps, said so loudly) above
it, never below the floor. Why this design and what it was measured against: docs/training.md.
"""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agents.train.config import SFTConfig
from forge_env.rl.trainer import TorchTrainer
from forge_env.rl.types import TrainSample

#: How often one mixed step may be undone and retried at half the learning rate (down to lr / 2**10).
MAX_BACKOFFS = 10


class ToolRateProbe:
    """The model's probability of opening its first turn with a tool call, averaged over fixed prompts.

    Computed exactly from one forward pass (the probability of the tool-call token at temperature 1,
    what evaluation samples at), not estimated by sampling, so the direct-answer phase can stop at
    the same tool-use rate on every machine: how many steps that takes depends on the CPU's
    arithmetic, the rate it stops at does not.
    """

    def __init__(self, tool_demonstrations: list[TrainSample], *, pad_token_id: int) -> None:
        self.prompts: list[list[int]] = []
        tool_tokens = set()
        for sample in tool_demonstrations:
            first = sample.loss_mask.index(1)
            self.prompts.append(sample.token_ids[:first])
            tool_tokens.add(sample.token_ids[first])
        if len(tool_tokens) != 1:
            raise ValueError(f"the demonstrations open with different tokens {sorted(tool_tokens)}: "
                             "target_tool_rate needs environments whose expert opens with a tool call")
        self.tool_token = tool_tokens.pop()
        self.pad_token_id = pad_token_id
        self.last_rate: float | None = None

    def rate(self, model: Any) -> float:
        import torch

        device = next(model.parameters()).device
        width = max(len(p) for p in self.prompts)
        ids = torch.full((len(self.prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(self.prompts):  # right padding: a causal model's earlier positions ignore it
            ids[row, : len(prompt)] = torch.tensor(prompt)
            mask[row, : len(prompt)] = 1
        last = torch.tensor([len(p) - 1 for p in self.prompts])
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        finally:
            model.train(was_training)
        probabilities = logits[torch.arange(len(self.prompts)), last.to(device)].float().softmax(-1)
        self.last_rate = float(probabilities[:, self.tool_token].mean())
        return self.last_rate


@dataclass
class GateResult:
    """How the mixed phase ended."""

    rate_before: float
    """First-turn tool-call rate before the phase (after the first phase)."""
    rate: float
    """The rate RL starts from."""
    steps: int
    """Mixed steps kept."""
    backoffs: int
    """Steps undone because they took the rate below the floor (each retried at half the lr)."""
    lr: float
    """The phase's learning rate at the end (after the halvings)."""
    in_band: bool
    """Whether the rate ended inside ``[min_tool_rate, target_tool_rate]``."""
    history: list[dict[str, float]] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {"tool_rate_before_mix": self.rate_before, "tool_rate": self.rate, "mixed_steps": float(self.steps),
                "mixed_backoffs": float(self.backoffs), "mixed_lr_end": self.lr, "tool_rate_in_band": float(self.in_band)}


def batches(samples: list[TrainSample], batch_size: int, seed: int) -> Iterator[list[TrainSample]]:
    """Batches of ``batch_size`` drawn without replacement, epoch after epoch, each epoch shuffled (seeded)."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            epoch = list(range(len(samples)))
            rng.shuffle(epoch)
            order.extend(epoch)
        yield [samples[i] for i in order[:batch_size]]
        del order[:batch_size]


def scale_lr(trainer: TorchTrainer, factor: float) -> float:
    """Multiply the trainer's learning rate (and its schedule's base) by ``factor``; return the new lr."""
    for group in trainer.optimizer.param_groups:
        group["lr"] *= factor
    trainer.scheduler.base_lrs = [lr * factor for lr in trainer.scheduler.base_lrs]
    return float(trainer.optimizer.param_groups[0]["lr"])


def snapshot(trainer: TorchTrainer) -> dict[str, Any]:
    """Copies of the weights, the optimizer's moments, the schedule and the step count."""
    return {"model": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
            "scheduler": copy.deepcopy(trainer.scheduler.state_dict()), "step": trainer.step}


def restore(trainer: TorchTrainer, saved: dict[str, Any]) -> None:
    """Put the trainer back to :func:`snapshot`'s state (the snapshot stays usable)."""
    trainer.model.load_state_dict(saved["model"])
    trainer.optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
    trainer.scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    trainer.step = saved["step"]


def _say(message: str) -> None:
    print(f"[sft] {message}", file=sys.stderr, flush=True)


def gated_mixed_phase(trainer: TorchTrainer, samples: list[TrainSample], probe: ToolRateProbe, config: SFTConfig,
                      *, seed: int = 0, rate: Callable[[Any], float] | None = None) -> GateResult:
    """Train on the mix until the tool-call rate lies in ``[min_tool_rate, target_tool_rate]``.

    A step that takes the rate from at or above the floor to below it is undone and retried at half the
    learning rate (at most :data:`MAX_BACKOFFS` times per step; then the phase stops where it was).
    ``rate`` replaces ``probe.rate`` (tests use it to script the rate).
    """
    if config.target_tool_rate is None:
        raise ValueError("gated_mixed_phase needs sft.target_tool_rate")
    measure = rate or probe.rate
    target, floor = config.target_tool_rate, config.min_tool_rate or 0.0
    current = before = measure(trainer.model)
    lr = scale_lr(trainer, (config.direct_answer_lr or config.lr) / config.lr)
    _say(f"tool-call rate at the first turn: {before:.1%} before the mix; band {floor:.0%}-{target:.0%}, "
         f"lr {lr:.2g}")
    draw = batches(samples, config.batch_size, seed)
    steps = backoffs = 0
    history: list[dict[str, float]] = []
    gave_up = False
    while not floor <= current <= target and steps < config.direct_answer_steps:
        batch = next(draw)
        saved = snapshot(trainer)
        for attempt in range(MAX_BACKOFFS + 1):
            if attempt:  # the restored state holds the lr of the first try
                restore(trainer, saved)
                lr = scale_lr(trainer, 0.5**attempt)
            metrics = trainer.train_step(batch)
            new = measure(trainer.model)
            if new >= floor or current < floor:
                break
            backoffs += 1
            retry = f"retried at lr {lr / 2:.2g}" if attempt < MAX_BACKOFFS else "giving up"
            _say(f"mixed step {steps + 1} took the rate from {current:.1%} to {new:.1%}, below the floor "
                 f"{floor:.0%}: undone, {retry}")
        else:
            restore(trainer, saved)
            gave_up = True
            break
        current = new
        steps += 1
        history.append({**metrics, "tool_rate": current})
        _say(f"mixed step {steps}: tool-call rate {current:.1%} (loss {metrics['loss']:.3f})")
    in_band = floor <= current <= target
    if in_band:
        _say(f"tool-call rate at the first turn {current:.1%}, inside the band {floor:.0%}-{target:.0%}, after "
             f"{steps} mixed steps ({backoffs} undone)")
    else:
        why = (f"even a step at lr {lr / 2**MAX_BACKOFFS:.2g} took it below the floor" if gave_up
               else f"still outside the band after the limit of {config.direct_answer_steps} mixed steps")
        _say(f"WARNING: tool-call rate at the first turn {current:.1%}, not inside the band {floor:.0%}-{target:.0%}: "
             f"{why} ({steps} steps kept, {backoffs} undone). RL starts from there.")
    return GateResult(rate_before=before, rate=current, steps=steps, backoffs=backoffs, lr=lr, in_band=in_band,
                      history=history)
