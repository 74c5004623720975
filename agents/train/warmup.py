"""Supervised warm-up before RL: expert demonstrations from the environment, trained with the SFT loss.

The environment's own expert (``expert_action``) plays ``num_demonstrations`` tasks; each episode
becomes a token-exact sample (``agents.sft``). ``direct_answer_fraction`` rewrites a share of them to
answer at once, without tool calls: a warm-up that sometimes skips the tools gives RL something to
discover (the tools pay off). The rewrites are mixed into the whole warm-up, or, with
``direct_answer_steps``, only into a short final phase, after the model has learned to use the tools
from unmodified demonstrations. ``target_loss`` stops the (first phase of the) warm-up once the model
has learned what it can: a tiny model learns to copy from its prompt abruptly, after a number of
steps that varies. With ``target_tool_rate`` the final phase runs until the first-turn tool-call rate
lies in ``[min_tool_rate, target_tool_rate]``, every step checked (``agents.train.tool_gate``).

With ``trainer.config.lora`` and ``sft.full_weights`` the warm-up trains every weight of the adapter's base
and :func:`attach_adapter` then gives RL a fresh adapter on the warmed-up (frozen) base.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import forge_env
from agents.sft import demonstration_samples
from agents.train.checkpoint import save_base_checkpoint
from agents.train.components import Components, build_trainer
from agents.train.config import GRPOConfig, SFTConfig
from agents.train.tool_gate import GateResult, ToolRateProbe, batches, gated_mixed_phase
from forge_env.chat import ChatRenderer
from forge_env.core.demonstrations import demonstrate
from forge_env.rl.lora import strip_adapter
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
    history = []
    draw = batches(samples, config.batch_size, seed)
    started = time.perf_counter()
    running: float | None = None
    for step in range(config.steps):
        batch = next(draw)
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
    else:
        if config.target_loss is not None and config.steps:
            print(f"[sft] WARNING: the target loss {config.target_loss} was not reached in {config.steps} steps "
                  f"(running {running:.3f}): the model may not have learned what RL builds on", file=sys.stderr,
                  flush=True)
    return history


#: Demonstrations whose first-turn prompts measure how often the model opens with a tool call.
PROBE_PROMPTS = 64


@dataclass
class WarmupResult:
    """What the warm-up did: every SFT step's metrics, and how the mixed phase ended (with a target rate)."""

    history: list[dict[str, float]]
    gate: GateResult | None = None


def mixed_samples(demos: list[dict[str, Any]], plain: list[TrainSample], config: SFTConfig,
                  renderer: ChatRenderer) -> list[TrainSample]:
    """``plain`` (the rendered ``demos``) with the ``direct_answer_fraction`` of them rewritten (seeded)."""
    mix = with_direct_answers(demos, config)
    # Only the rewritten demonstrations need rendering again (rendering thousands takes seconds).
    rewritten = [i for i, (m, d) in enumerate(zip(mix, demos, strict=True)) if m is not d]
    mixed = list(plain)
    for i, sample in zip(rewritten, demonstration_samples([mix[i] for i in rewritten], renderer), strict=True):
        mixed[i] = sample
    return mixed


async def warm_up(trainer: TorchTrainer, renderer: ChatRenderer, env_id: str, env_kwargs: dict[str, Any],
                  config: SFTConfig, *, seed: int = 0) -> WarmupResult:
    """Collect demonstrations and train on them (the trainer must use the ``sft`` loss).

    With ``direct_answer_steps``, the warm-up runs on the unmodified demonstrations first, then on the mix
    with direct answers: that many steps, or, with ``target_tool_rate``, until the first-turn tool-call
    rate lies in ``[min_tool_rate, target_tool_rate]`` (``agents.train.tool_gate``). Otherwise on the mix
    throughout.
    """
    demos = await expert_demonstrations(env_id, env_kwargs, config)
    if not config.direct_answer_steps:
        mix = with_direct_answers(demos, config)
        return WarmupResult(run_warmup(trainer, demonstration_samples(mix, renderer), config, seed=seed))
    plain = demonstration_samples(demos, renderer)
    history = run_warmup(trainer, plain, config, seed=seed)
    mixed = mixed_samples(demos, plain, config, renderer)
    if config.target_tool_rate is None:
        print(f"[sft] {config.direct_answer_steps} more steps with {config.direct_answer_fraction:.0%} of the "
              "demonstrations answering without tools", file=sys.stderr, flush=True)
        final = replace(config, steps=config.direct_answer_steps, target_loss=None)
        return WarmupResult(history + run_warmup(trainer, mixed, final, seed=seed + 1))
    print(f"[sft] up to {config.direct_answer_steps} more steps with {config.direct_answer_fraction:.0%} of the "
          "demonstrations answering without tools", file=sys.stderr, flush=True)
    probe = ToolRateProbe(plain[:PROBE_PROMPTS], pad_token_id=trainer.pad_token_id)
    gate = gated_mixed_phase(trainer, mixed, probe, config, seed=seed + 1)
    return WarmupResult(history + gate.history, gate)


def sft_trainer_for(config: GRPOConfig, trainer: Any, weight_store: Any) -> TorchTrainer:
    """The warm-up's trainer on the RL ``trainer``'s model (the ``sft`` loss, ``sft``'s learning rate and
    schedule); with ``sft.full_weights`` on that model's base, its adapter removed, every weight trained."""
    sft, full = config.sft, config.sft.full_weights
    model = strip_adapter(trainer.model) if full else trainer.model
    return build_trainer(config, model, weight_store, loss="sft", lr=sft.lr, temperature=1.0, loss_kwargs={},
                         lr_schedule=sft.lr_schedule,
                         warmup_steps=max(1, sft.steps // 20) if sft.lr_schedule == "cosine" else 0,
                         total_steps=sft.steps + sft.direct_answer_steps, min_lr_ratio=0.1,
                         **({"lora": None} if full else {}))


def attach_adapter(config: GRPOConfig, components: Components, warmed: Any) -> str:
    """After a full-weight warm-up (``sft.full_weights``): replace ``components.trainer`` by the RL trainer,
    a fresh LoRA adapter (``B = 0``: the warmed-up policy) on ``warmed``, frozen, its optimizer over the
    adapter alone; write that base once (``checkpoints/base``) and return its name for ``LoopState``."""
    components.trainer = build_trainer(config, warmed, components.weight_store)
    name = save_base_checkpoint(config.loop.output_dir, components.trainer)
    print("[sft] the warm-up trained every weight; RL trains a LoRA adapter on the warmed-up base "
          f"(checkpoints/{name})", file=sys.stderr, flush=True)
    return name


async def push_base(components: Components, version: int) -> None:
    """Push the LoRA trainer's base weights in full as ``version`` and have the generators load them: they
    take it as their new base and drop their adapter (before the first adapter push, and on resume)."""
    await asyncio.to_thread(components.trainer.push_weights, version, full=True)  # type: ignore[call-arg]
    await components.generator.update_weights(version)
