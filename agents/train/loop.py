"""The GRPO training loops, synchronous and asynchronous, over the same rollout and training steps.

One *round* plays ``rollout.groups_per_step`` tasks ``rollout.group_size`` times each with the
generator's current weights, turns the finished episodes into training samples with group-relative
advantages, and adds them to the replay buffer. One *step* takes a batch from the buffer, trains on it,
pushes the new weights to the weight store and has the generator load them.

- ``sync``: when the buffer cannot give a batch at the current policy version, play a round; otherwise
  train. Rollouts and training take turns.
- ``async``: rounds run continuously in one task while training runs in another (the optimizer step in a
  worker thread); the buffer joins them, and ``buffer.max_policy_age`` bounds how stale a trained-on
  episode may be. Rollouts pause while the buffer holds ``loop.max_rollouts_ahead`` batches. With
  ``loop.partial_rollouts`` episodes stream instead of playing in rounds and weight updates land
  without waiting for them (:mod:`agents.train.partial`). Either way the rollouts come from a
  :class:`~agents.train.producer.Producer` that sees the loop only through its public ``LoopHost`` side.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.groups import stream_groups
from agents.rollout import EpisodeBudget
from agents.train.checkpoint import LoopState, latest_checkpoint, load_checkpoint, save_checkpoint
from agents.train.components import Components, build_components, build_reference
from agents.train.config import GRPOConfig
from agents.train.evaluation import EvalResult, describe, eval_seeds, evaluate
from agents.train.gateway_source import gateway_source_for
from agents.train.ingest import round_metrics, train_samples
from agents.train.metrics import MetricsLogger
from agents.train.partial import PartialRollouts
from agents.train.producer import Producer, RoundProducer
from agents.train.reports import clear_previous_run, describe_rounds, write_reports
from agents.train.sampling import RoundSampler
from agents.train.warmup import attach_adapter, push_base, sft_trainer_for, warm_up
from agents.trajectory import Trajectory
from forge_env.config import to_dict
from forge_env.generation.base import SamplingParams, derive_seed
from forge_env.rl.types import TrainSample


@dataclass
class RunResult:
    """What a training run did: its final state, evaluations, throughput and where its files are."""

    output_dir: Path
    state: LoopState
    eval_before: EvalResult | None = None
    eval_after: EvalResult | None = None
    wall_s: float = 0.0
    rl_wall_s: float = 0.0
    episodes_per_s: float = 0.0
    trainer_idle_fraction: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)
    """Seconds spent generating rollouts, in optimizer steps and in weight sync (async: they overlap)."""
    files: dict[str, str] = field(default_factory=dict)
    rl_stopped: str | None = None
    """Why RL stopped before ``loop.steps`` (``loop.max_rounds_without_step`` rounds in a row without a
    step), or None when it ran all its steps."""
    warmup: dict[str, float] = field(default_factory=dict)
    """How the SFT warm-up ended (``tool_gate.GateResult.metrics``: the first-turn tool-call rate RL starts from)."""


#: Buffer counters logged with every step: what the staleness bound dropped or masked (cumulative).
_STALENESS_METRICS = ("buffer/evicted_policy_age", "buffer/stale_tokens_masked", "buffer/stale_turns_masked")


class GRPOLoop:
    """Runs one GRPO application: warm-up, evaluation, the sync or async loop, checkpoints, reports."""

    def __init__(self, config: GRPOConfig, components: Components, logger: MetricsLogger) -> None:
        self.config = config
        self.c = components
        self.logger = logger
        self.state = LoopState()
        self.reference: Any = None
        cfg = config.rollout
        self.budget = EpisodeBudget(max_turns=cfg.max_turns, max_total_tokens=cfg.max_total_tokens,
                                    step_timeout_s=cfg.step_timeout_s, deadline_s=cfg.deadline_s)
        self.last_round: dict[str, float] = {}
        self.rollout_s = 0.0
        self.train_s = 0.0
        self.sync_s = 0.0
        self.idle_s = 0.0
        self.rl_started = 0.0
        self.rl_episodes_at_start = 0
        self.rounds_since_step = 0
        self.rl_stopped: str | None = None
        self.warmup: dict[str, float] = {}
        self._new_data = asyncio.Event()
        self._update: asyncio.Future | None = None  # partial rollouts: the weight load still landing
        self.round_sampler = RoundSampler.from_config(config)
        self.gateway_source = gateway_source_for(config, components)  # None unless rollout.source=gateway

    # ------------------------------------------------------------------ set-up
    async def start(self) -> EvalResult | None:
        """Resume or warm up, publish the starting weights, evaluate before RL."""
        cfg = self.config
        checkpoint = latest_checkpoint(cfg.loop.output_dir) if cfg.loop.resume else None
        if checkpoint is not None:
            self.state = load_checkpoint(checkpoint, self.c.trainer, self.c.buffer,
                                         require_base=cfg.sft.full_weights)
            print(f"[train] resumed from {checkpoint} at step {self.state.step} "
                  f"(task {self.state.next_task}, {len(self.c.buffer)} samples in the buffer)", file=sys.stderr)
        elif cfg.sft.enabled:
            await self._warm_up()
        self.reference = build_reference(cfg, self.c.trainer)
        if self.state.base_checkpoint is not None:  # the warmed-up base, in full, before the first adapter
            await push_base(self.c, self.state.policy_version)
        await self._publish(self.state.policy_version)
        return await self.evaluate("before RL" if self.state.step == 0 else f"resumed at step {self.state.step}")

    async def _warm_up(self) -> None:
        cfg = self.config
        sft_trainer = sft_trainer_for(cfg, self.c.trainer, self.c.weight_store)
        started = time.perf_counter()
        result = await warm_up(sft_trainer, self.c.renderer, cfg.env.id, cfg.env.kwargs, cfg.sft,
                               seed=cfg.loop.seed)
        history = result.history
        self.warmup = {"steps": float(len(history)), "seconds": time.perf_counter() - started,
                       **(result.gate.metrics() if result.gate is not None else {})}
        self.logger.log(0, "sft", {"steps": len(history), "loss_first": history[0]["loss"],
                                   "loss_last": history[-1]["loss"], **self.warmup})
        if cfg.sft.full_weights:  # RL trains a fresh adapter on the warmed-up base (pushed in full by start)
            self.state.base_checkpoint = attach_adapter(cfg, self.c, sft_trainer.model)

    async def _publish(self, version: int, wait: bool = True) -> None:
        """Trainer -> weight store -> generator(s).

        ``wait=False`` (partial rollouts): the generators load ``version`` while the trainer goes on; the
        next publish (or an evaluation) first waits for that load to land, so at most one is in flight.
        """
        started = time.perf_counter()
        await self.landed()
        await asyncio.to_thread(self.c.trainer.push_weights, version)
        if wait:
            await self.c.generator.update_weights(version)
        else:
            self._update = asyncio.ensure_future(self.c.generator.update_weights(version))
        self.sync_s += time.perf_counter() - started
        self.state.policy_version = version

    async def landed(self) -> None:
        """Wait for a weight load handed to the generators without waiting (re-raises its failure)."""
        update, self._update = self._update, None
        if update is not None:
            await update

    # ------------------------------------------------------------------ pieces
    def _play_groups(self, requests: list, round_index: int) -> AsyncIterator[list[Trajectory]]:
        """The round's groups as they finish: env episodes, or harness runs through the gateway."""
        sampling = self.round_sampling(round_index)
        if self.gateway_source is None:
            cfg = self.config
            return stream_groups(requests, self.c.env_factory, self.c.generator, self.c.renderer, sampling=sampling,
                                 budget=self.budget, max_episodes_in_flight=cfg.rollout.max_episodes_in_flight,
                                 env_id=cfg.env.id, lost_episodes=cfg.rollout.lost_episodes_policy())
        return self.gateway_source.groups(requests, sampling)

    def round_sampling(self, round_index: int) -> SamplingParams:
        s = self.config.rollout.sampling
        # A base seed per round, reproducible from loop.seed; groups, episodes and turns derive their own from it.
        seed = derive_seed(self.config.loop.seed, "round", round_index)
        return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=s.max_tokens,
                              stop_token_ids=tuple(s.stop_token_ids), seed=seed)

    async def collect_round(self) -> dict[str, float]:
        """Play one round at the current policy, add its trainable samples to the buffer; return its metrics."""
        cfg, state = self.config, self.state
        round_index = state.rounds
        started = time.perf_counter()
        # Which tasks, and how many groups (rollout.curriculum, rollout.dynamic_sampling): agents.train.sampling.
        played = await self.round_sampler.play(state, lambda requests: self._play_groups(requests, round_index))
        trajectories = played.trajectories
        # Counted with the tasks it moved past (play() advanced state.next_task): an async producer cancelled
        # in the awaits below must leave the two consistent.
        state.rounds += 1
        state.episodes += len(trajectories)
        seconds = time.perf_counter() - started
        self.rollout_s += seconds
        kept, advantages = train_samples(trajectories, cfg)
        if kept and self.reference is not None:
            await asyncio.to_thread(self.reference.annotate, kept)
        self.c.buffer.add(kept)
        self.samples_added()
        metrics = round_metrics(trajectories, len(kept), advantages, seconds, cfg.eval.success_threshold,
                                played.metrics)
        errors = int(metrics["rollout/errors"])
        if errors:
            first = next(t for t in trajectories if not t.ok)
            print(f"[train] round {round_index}: {errors} episode(s) failed, e.g. {first.error}",
                  file=sys.stderr, flush=True)
        self.last_round = metrics
        return metrics

    def samples_added(self) -> None:
        """New samples are in the buffer: wake the async trainer if it waits for a batch."""
        self._new_data.set()

    def round_finished(self, metrics: dict[str, float], seconds: float) -> bool:
        """A producer's round is done (``LoopHost``): record it; True when RL must stop."""
        self.rollout_s += seconds
        self.last_round = metrics
        return self.after_round()

    async def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """One optimizer step (in a worker thread, so rollouts and services keep running), then weight sync."""
        started = time.perf_counter()
        metrics = await asyncio.to_thread(self.c.trainer.train_step, batch)
        self.train_s += time.perf_counter() - started
        self.state.step += 1
        self.rounds_since_step = 0
        await self._publish(self.state.step, wait=not self.config.loop.partial_rollouts)
        return metrics

    async def after_step(self, metrics: dict[str, float]) -> None:
        """Log, print progress, evaluate and checkpoint as configured."""
        cfg, state = self.config, self.state
        elapsed = time.perf_counter() - self.rl_started
        episodes = state.episodes - self.rl_episodes_at_start
        buffer = self.c.buffer.metrics(state.policy_version)
        record = {**metrics, **self.last_round, "policy_version": float(state.policy_version),
                  "episodes_total": float(state.episodes), "episodes_per_s": episodes / max(elapsed, 1e-9),
                  "elapsed_s": elapsed, "buffer/size": buffer.get("buffer/size", float(len(self.c.buffer))),
                  **{k: buffer[k] for k in _STALENESS_METRICS if k in buffer}}
        self.logger.log(state.step, "train", record)
        if cfg.logging.progress:
            done = state.step / max(cfg.loop.steps, 1)
            bar = "#" * int(done * 20) + "." * (20 - int(done * 20))
            print(f"[train] [{bar}] step {state.step}/{cfg.loop.steps} "
                  f"reward {self.last_round.get('rollout/reward_mean', float('nan')):.3f} "
                  f"loss {metrics.get('loss', float('nan')):.4f} "
                  f"{record['episodes_per_s']:.1f} ep/s {elapsed:.0f}s", file=sys.stderr, flush=True)
        if cfg.eval.every and state.step % cfg.eval.every == 0 and state.step < cfg.loop.steps:
            await self.evaluate(f"step {state.step}")
        if cfg.loop.checkpoint_every and state.step % cfg.loop.checkpoint_every == 0:
            self.checkpoint()

    def checkpoint(self) -> Path:
        return save_checkpoint(self.config.loop.output_dir, self.c.trainer, self.c.buffer, self.state)

    async def evaluate(self, label: str) -> EvalResult | None:
        """Play the held-out tasks with the generator's current weights; log and print the result."""
        cfg = self.config.eval
        if cfg.num_tasks <= 0:
            return None
        await self.landed()
        s = self.config.rollout.sampling
        sampling = SamplingParams(temperature=cfg.temperature, top_p=s.top_p if cfg.temperature else 1.0,
                                  max_tokens=cfg.max_tokens or s.max_tokens, seed=0)
        result = await evaluate(self.c.eval_env_factory, self.c.generator, self.c.renderer,
                                seeds=eval_seeds(cfg.seed_start, cfg.num_tasks), sampling=sampling,
                                budget=self.budget, success_threshold=cfg.success_threshold,
                                max_episodes_in_flight=self.config.rollout.max_episodes_in_flight,
                                env_id=self.config.env.id)
        self.logger.log(self.state.step, "eval", {"label": label, **result.summary()})
        print(describe(result, label), file=sys.stderr, flush=True)
        return result

    # ------------------------------------------------------------------ loops
    async def run_sync(self) -> None:
        while self.state.step < self.config.loop.steps:
            batch = self.c.buffer.sample(self.state.policy_version)
            if batch is None:
                await self.collect_round()
                if self.after_round():
                    return
                continue
            metrics = await self.train_step(batch)
            await self.after_step(metrics)

    async def run_async(self) -> None:
        stop = asyncio.Event()
        strategy: Producer = PartialRollouts(self) if self.config.loop.partial_rollouts else RoundProducer(self)
        producer = asyncio.create_task(strategy.produce(stop))
        try:
            while self.state.step < self.config.loop.steps:
                batch = self.c.buffer.sample(self.state.policy_version)
                if batch is None:
                    self._new_data.clear()
                    waited = time.perf_counter()
                    new_data = asyncio.ensure_future(self._new_data.wait())
                    done, _ = await asyncio.wait({producer, new_data}, return_when=asyncio.FIRST_COMPLETED)
                    new_data.cancel()
                    self.idle_s += time.perf_counter() - waited
                    if producer in done:
                        producer.result()  # re-raise what stopped the rollouts
                        if self.rl_stopped:
                            return
                    continue
                metrics = await self.train_step(batch)
                await self.after_step(metrics)
        finally:
            stop.set()
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            await self.landed()

    def after_round(self) -> bool:
        """Count the round just played; True when RL must stop (too many rounds in a row without a step).

        A round whose groups all earned equal rewards trains nothing: it is skipped (it cost only its
        rollouts) and said so, and it does not count as a step.
        """
        state, limit = self.state, self.config.loop.max_rounds_without_step
        self.rounds_since_step += 1
        groups = self.last_round.get("advantages/num_groups", 0.0)
        if groups > self.last_round.get("advantages/zero_variance_groups", 0.0):
            state.rounds_trainable += 1
        elif self.config.logging.progress:
            fate = ("nothing to train on, skipped" if self.config.advantages.drop_zero_variance else
                    "its zero-advantage samples go to the buffer (advantages.drop_zero_variance=false)")
            print(f"[train] round {state.rounds}: every group's episodes earned equal rewards (mean "
                  f"{self.last_round.get('rollout/reward_mean', float('nan')):.3f}): {fate} "
                  f"({self.rounds_since_step} round(s) since the last step; at step {state.step})",
                  file=sys.stderr, flush=True)
        if self.rounds_since_step < limit:
            return False
        skipped = state.rounds - state.rounds_trainable
        self.rl_stopped = (
            f"{limit} rollout rounds in a row without an optimizer step, so RL stopped at step {state.step} of "
            f"{self.config.loop.steps}: of {state.rounds} rounds, {skipped} had only groups whose episodes all "
            "earned equal rewards (no learning signal) and the rest too few trainable episodes to fill a batch of "
            f"{self.config.buffer.batch_size}. The policy RL started from is too weak or too strong for these "
            "tasks: check the warm-up (its end rate, the success before RL), the environment's difficulty, or "
            "raise rollout.group_size")
        print(f"[train] {self.rl_stopped}", file=sys.stderr, flush=True)
        return True

    async def run(self) -> RunResult:
        """The whole run: start, the loop of ``loop.mode``, final evaluation, checkpoint and reports."""
        cfg = self.config
        started = time.perf_counter()
        before = await self.start()
        step_at_start = self.state.step
        self.rl_started = time.perf_counter()
        self.rl_episodes_at_start = self.state.episodes
        self.idle_s = 0.0
        self.rollout_s = self.train_s = self.sync_s = 0.0  # the RL loop's own (not warm-up / first publish)
        if cfg.loop.mode == "async":
            await self.run_async()
        else:
            await self.run_sync()
        rl_wall = time.perf_counter() - self.rl_started
        trained = self.state.step - step_at_start
        # Without a step the weights are those evaluated before RL.
        after = await self.evaluate(f"after RL (step {self.state.step})") if cfg.loop.steps and trained else before
        path = self.checkpoint()
        episodes = self.state.episodes - self.rl_episodes_at_start
        idle = self.idle_s if cfg.loop.mode == "async" else rl_wall - self.train_s
        stages = {"generation": self.rollout_s, "training": self.train_s, "weight_sync": self.sync_s}
        result = RunResult(output_dir=Path(cfg.loop.output_dir), state=self.state, eval_before=before,
                           eval_after=after, wall_s=time.perf_counter() - started, rl_wall_s=rl_wall,
                           episodes_per_s=episodes / max(rl_wall, 1e-9),
                           trainer_idle_fraction=idle / max(rl_wall, 1e-9), stage_s=stages,
                           rl_stopped=self.rl_stopped, warmup=self.warmup)
        overlap = " (async: generation overlaps the other two)" if cfg.loop.mode == "async" else ""
        print(f"[train] wall {result.wall_s:.1f} s, RL loop {rl_wall:.1f} s: generation {self.rollout_s:.1f} s, "
              f"training {self.train_s:.1f} s, weight sync {self.sync_s:.1f} s{overlap}", file=sys.stderr, flush=True)
        print(f"[train] {describe_rounds(self.state, cfg.loop.steps)}", file=sys.stderr, flush=True)
        result.files = write_reports(cfg, result, path, self.logger.path, self.c.tokenizer)
        return result


async def train(config: GRPOConfig) -> RunResult:
    """Build the application from ``config``, run it, and shut everything down."""
    import yaml

    config.validate()
    out = Path(config.loop.output_dir)
    if not config.loop.resume:
        clear_previous_run(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    started = time.perf_counter()
    components = await build_components(config)
    print(f"[train] trainer, generator and environments ready in {time.perf_counter() - started:.1f} s",
          file=sys.stderr, flush=True)
    logger = MetricsLogger(out, tensorboard=config.logging.tensorboard, wandb=config.logging.wandb,
                           wandb_project=config.logging.wandb_project, config=to_dict(config))
    try:
        return await GRPOLoop(config, components, logger).run()
    finally:
        logger.close()
        await components.close()

