"""Supervised warm-up before RL: expert demonstrations from the environment, trained with the SFT loss.

The environment's own expert (``expert_action``) plays ``num_demonstrations`` tasks; each episode
becomes a token-exact sample (``agents.sft``). ``direct_answer_fraction`` rewrites a share of them to
answer at once, without tool calls: a warm-up that sometimes skips the tools gives RL something to
discover (the tools pay off). The rewrites are mixed into the whole warm-up, or, with
``direct_answer_steps``, only into a short final phase, after the model has learned to use the tools
from unmodified demonstrations. ``target_loss`` stops the (first phase of the) warm-up once the model
has learned what it can: a tiny model learns to copy from its prompt abruptly, after a number of
steps that varies.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import forge_env
from agents.sft import demonstration_samples
from agents.train.config import SFTConfig
from forge_env.chat import ChatRenderer
from forge_env.core.demonstrations import demonstrate
from forge_env.rl.trainer import TorchTrainer
from forge_env.rl.types import TrainSample


def direct_answer(demo: dict[str, Any], *, train_prefix_tokens: int | None = None) -> dict[str, Any]:
    """The demonstration without its tool calls: the opening messages, then the final answer straight away.

    ``train_prefix_tokens`` limits the loss on that answer to its first tokens (see ``agents.sft``).
    """
    messages = demo["messages"]
    first_turn = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    opening = messages[:first_turn]
    final = messages[-1]
    if final["role"] != "assistant" or final.get("tool_calls"):
        raise ValueError("a demonstration must end with the assistant's final answer")
    answer: dict[str, Any] = {"role": "assistant", "content": final.get("content", "")}
    if train_prefix_tokens is not None:
        answer["train_prefix_tokens"] = train_prefix_tokens
    return {**demo, "messages": [*opening, answer]}


async def collect_demonstrations(env_id: str, env_kwargs: dict[str, Any], config: SFTConfig) -> list[dict[str, Any]]:
    """The expert's episodes on seeds ``seed_start ...``, a ``direct_answer_fraction`` of them rewritten."""
    return with_direct_answers(await expert_demonstrations(env_id, env_kwargs, config), config)


async def expert_demonstrations(env_id: str, env_kwargs: dict[str, Any], config: SFTConfig) -> list[dict[str, Any]]:
    """The expert's episodes on seeds ``seed_start ... seed_start + num_demonstrations - 1``."""
    env = forge_env.make(env_id, **env_kwargs)
    if not callable(getattr(env, "expert_action", None)):
        raise ValueError(f"{env_id} has no expert_action, so it cannot produce demonstrations for sft; "
                         "disable sft or pick an environment with an expert")
    try:
        demos = [await demonstrate(env, seed=config.seed_start + i) for i in range(config.num_demonstrations)]
    finally:
        env.close()
    return demos


def with_direct_answers(demos: list[dict[str, Any]], config: SFTConfig) -> list[dict[str, Any]]:
    """``demos`` with a seeded ``direct_answer_fraction`` of them rewritten by :func:`direct_answer`."""
    rng = random.Random(config.seed_start)
    prefix = 1 if config.direct_answer_loss == "first_token" else None
    return [direct_answer(d, train_prefix_tokens=prefix) if rng.random() < config.direct_answer_fraction else d
            for d in demos]


def run_warmup(trainer: TorchTrainer, samples: list[TrainSample], config: SFTConfig, *, seed: int = 0,
               on_step: Callable[[int, dict[str, float]], None] | None = None,
               stop: Callable[[TorchTrainer, int], bool] | None = None) -> list[dict[str, float]]:
    """Up to ``config.steps`` SFT steps of ``config.batch_size`` samples drawn (seeded) from ``samples``,
    stopping early when the running mean of the loss reaches ``config.target_loss`` or ``stop(trainer, step)``
    says so."""
    rng = random.Random(seed)
    history = []
    order: list[int] = []
    started = time.perf_counter()
    running: float | None = None
    for step in range(config.steps):
        if len(order) < config.batch_size:  # epochs in a fresh shuffled order
            epoch = list(range(len(samples)))
            rng.shuffle(epoch)
            order.extend(epoch)
        batch = [samples[i] for i in order[: config.batch_size]]
        del order[: config.batch_size]
        metrics = trainer.train_step(batch)
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
        running = metrics["loss"] if running is None else 0.95 * running + 0.05 * metrics["loss"]
        if (step + 1) % max(1, config.steps // 10) == 0 or step + 1 == config.steps:
            print(f"[sft] step {step + 1}/{config.steps} loss {metrics['loss']:.3f} (running {running:.3f}, "
                  f"{time.perf_counter() - started:.0f}s)", file=sys.stderr, flush=True)
        # The running mean needs some history before it means anything.
        if config.target_loss is not None and step >= 50 and running <= config.target_loss:
            print(f"[sft] reached the target loss {config.target_loss} at step {step + 1} "
                  f"({time.perf_counter() - started:.0f}s)", file=sys.stderr, flush=True)
            break
        if stop is not None and stop(trainer, step + 1):
            break
    return history


#: Demonstrations whose first-turn prompts measure how often the model opens with a tool call.
PROBE_PROMPTS = 64


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

    def stop_at(self, target: float) -> Callable[[TorchTrainer, int], bool]:
        """A ``run_warmup`` stop condition: the rate has fallen to ``target``."""

        def reached(trainer: TorchTrainer, step: int) -> bool:
            rate = self.rate(trainer.model)
            if rate <= target:
                print(f"[sft] tool-call rate at the first turn {rate:.1%} <= {target:.0%} after {step} mixed steps",
                      file=sys.stderr, flush=True)
                return True
            return False

        return reached


async def warm_up(trainer: TorchTrainer, renderer: ChatRenderer, env_id: str, env_kwargs: dict[str, Any],
                  config: SFTConfig, *, seed: int = 0) -> list[dict[str, float]]:
    """Collect demonstrations and train on them (the trainer must use the ``sft`` loss).

    With ``direct_answer_steps``, the warm-up runs on the unmodified demonstrations first, then that many
    steps on the mix with direct answers; otherwise on the mix throughout.
    """
    demos = await expert_demonstrations(env_id, env_kwargs, config)
    mix = with_direct_answers(demos, config)
    if not config.direct_answer_steps:
        return run_warmup(trainer, demonstration_samples(mix, renderer), config, seed=seed)
    plain = demonstration_samples(demos, renderer)
    history = run_warmup(trainer, plain, config, seed=seed)
    # Only the rewritten demonstrations need rendering again (rendering thousands takes seconds).
    rewritten = [i for i, (m, d) in enumerate(zip(mix, demos, strict=True)) if m is not d]
    mixed = list(plain)
    for i, sample in zip(rewritten, demonstration_samples([mix[i] for i in rewritten], renderer), strict=True):
        mixed[i] = sample
    print(f"[sft] up to {config.direct_answer_steps} more steps with {config.direct_answer_fraction:.0%} of the "
          "demonstrations answering without tools", file=sys.stderr, flush=True)
    final = replace(config, steps=config.direct_answer_steps, target_loss=None)
    stop = None
    if config.target_tool_rate is not None:
        probe = ToolRateProbe(plain[:PROBE_PROMPTS], pad_token_id=trainer.pad_token_id)
        print(f"[sft] tool-call rate at the first turn: {probe.rate(trainer.model):.1%} before the mix",
              file=sys.stderr, flush=True)
        stop = probe.stop_at(config.target_tool_rate)
    return history + run_warmup(trainer, mixed, final, seed=seed + 1, stop=stop)
