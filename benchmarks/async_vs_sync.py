"""The same small GRPO job in the synchronous loop, the asynchronous loop and the asynchronous loop with
partial rollouts: throughput and trainer idle time.

Every run uses the tiny model, a generator service in its own process, the replay buffer, the trainer and
weight sync, with identical sizes and seeds. It prints, per mode, episodes/s and optimizer steps/s over
the RL phase and the trainer's idle fraction (sync: the share of time spent not training, i.e. waiting
for rollouts; async: time the trainer waited for a batch), then the ratios to sync. Episodes/s counts
finished episodes: streaming modes finish more short ones in the same time (long ones are still in flight
when the run ends), so steps/s (every mode trains the same number of samples per step) is the unbiased
throughput. Also: mean turns per episode trained on (last round of each step), samples dropped by the
staleness bound, tokens it masked (partial), prompt tokens re-prefilled after updates, groups aborted.

Workloads:

- ``uniform``: Arithmetic-v0 on a Monarch environment replica (episodes of one turn, about equal length);
- ``long-tail``: ``LongTail-v0`` (below) in this process: every turn ends at one of 32 stop tokens (about 8
  tokens a turn), each env turn takes ``--tool-latency`` seconds (a tool call; no CPU) and the env asks
  for more turns; an episode whose first turn hashes into the first fifth (20% of them, decided by what
  the policy sampled) runs ``8 x`` the turns of the others (16 instead of 2).

    python -m benchmarks.async_vs_sync [--workload long-tail] [--modes sync,async,partial] [--steps 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import zlib
from typing import Any

import forge_env
from agents.train.config import load_grpo_config
from agents.train.loop import train
from agents.train.metrics import read_metrics
from forge_env.core.env import TextEnv
from forge_env.core.episode import AnswerOutcome, EpisodeState

LONG_TAIL_ID = "bench/LongTail-v0"
#: Every 8th byte ends a turn: about 8 tokens a turn from the untrained tiny model.
STOP_TOKEN_IDS = list(range(0, 256, 8))


class LongTailEnv(TextEnv):
    """Episodes of ``short_turns`` turns, or ``short_turns x factor`` for the ``long_fraction`` of episodes
    whose first assistant turn hashes into it (the policy's sample decides, so a group mixes lengths).
    Each turn's reply asks for more; the last one is scored by a hash of its text (rewards vary)."""

    def __init__(self, *, short_turns: int = 2, factor: int = 8, long_fraction: float = 0.2,
                 tool_latency_s: float = 0.0, **kwargs: Any):
        super().__init__(max_turns=short_turns * factor + 1, **kwargs)
        self.short_turns, self.factor, self.long_fraction = short_turns, factor, long_fraction
        self.tool_latency_s = tool_latency_s

    def sample_task(self, rng: Any) -> dict[str, Any]:
        return {"prompt": f"Say something, task {int(rng.integers(1_000_000))}."}

    async def on_final_answer(self, message: Any, state: EpisodeState) -> AnswerOutcome:
        text = message.get("content") or ""
        if "turns" not in state.data:
            long = zlib.crc32(text.encode()) % 1000 < self.long_fraction * 1000
            state.data["turns"] = self.short_turns * (self.factor if long else 1)
        state.data["played"] = state.data.get("played", 0) + 1
        if self.tool_latency_s:  # what a tool call or a sandbox run costs in wall time (not this CPU's)
            await asyncio.sleep(self.tool_latency_s)
        if state.data["played"] < state.data["turns"]:
            return AnswerOutcome(reward=0.0, done=False, messages=[{"role": "user", "content": "Go on."}])
        return AnswerOutcome(reward=float(zlib.crc32(text.encode()) % 3) / 2, done=True)


def register_long_tail() -> None:
    if LONG_TAIL_ID not in forge_env.specs():
        forge_env.register(LONG_TAIL_ID, LongTailEnv, description="benchmark: heavy-tailed episode lengths")


MODES = {"sync": ["loop.mode=sync"], "async": ["loop.mode=async"],
         "partial": ["loop.mode=async", "loop.partial_rollouts=true"],
         # APRIL-style: one group over what fits in flight; the slowest running group is aborted each round.
         "april": ["loop.mode=async", "loop.partial_rollouts=true", "loop.overprovision=1"]}


def job(mode: str, out: str, args: argparse.Namespace) -> list[str]:
    batch = args.group_size * args.groups
    common = [
        *MODES[mode], f"loop.steps={args.steps}", f"loop.output_dir={out}", "loop.seed=0",
        f"rollout.group_size={args.group_size}", f"rollout.groups_per_step={args.groups}",
        f"buffer.batch_size={batch}", "buffer.max_policy_age=1",
        "advantages.drop_zero_variance=false", "trainer.config.lr=1e-4", "trainer.config.device=cpu",
        "trainer.config.loss_kwargs.kl_coef=0", f"trainer.config.micro_batch_size={batch}",
        "generator.service=true", "generator.device=cpu", "eval.num_tasks=0",
        "logging.tensorboard=false", "logging.progress=false", "sft.enabled=false",
    ]
    if args.workload == "uniform":
        return [*common, "env.kwargs={num_operands: 2, digits: 2, operators: '+-*', max_turns: 3}",
                "rollout.max_turns=3", "rollout.sampling.max_tokens=64"]
    return [*common, f"env.id={LONG_TAIL_ID}", "env.service.backend=local",
            f"env.kwargs={{tool_latency_s: {args.tool_latency}}}", "rollout.max_turns=17",
            "rollout.max_total_tokens=1536", "rollout.sampling.max_tokens=48",
            f"rollout.sampling.stop_token_ids={STOP_TOKEN_IDS}",
            f"rollout.max_episodes_in_flight={args.in_flight or 2 * batch}"]


def run(mode: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        config = load_grpo_config(None, job(mode, out, args))
        result = asyncio.run(train(config))
        steps = [r for r in read_metrics(os.path.join(out, "metrics.jsonl")) if r["kind"] == "train"]
    last = steps[-1] if steps else {}
    return {"episodes_per_s": result.episodes_per_s, "idle": result.trainer_idle_fraction,
            "episodes": float(result.state.episodes), "rl_wall_s": result.rl_wall_s, "steps": float(len(steps)),
            "steps_per_s": len(steps) / max(result.rl_wall_s, 1e-9),
            "turns_mean": sum(r.get("rollout/turns_mean", 0.0) for r in steps) / max(len(steps), 1),
            "masked_tokens": last.get("buffer/stale_tokens_masked", 0.0),
            "evicted": last.get("buffer/evicted_policy_age", 0.0),
            "aborted": last.get("rollout/partial/groups_aborted", 0.0),
            "reprefilled": sum(r.get("rollout/partial/reprefilled_tokens", 0.0) for r in steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["uniform", "long-tail"], default="uniform")
    parser.add_argument("--modes", default=None, help="comma-separated of sync,async,partial,april "
                        "(default: sync,async for uniform; all three for long-tail)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=0, help="long-tail: rollout.max_episodes_in_flight "
                        "(default: two batches; a round-based loop never has more than a round in flight)")
    parser.add_argument("--tool-latency", type=float, default=0.5, help="long-tail: wall seconds each env turn "
                        "takes (a tool call, a sandbox run)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    register_long_tail()
    modes = (args.modes or ("sync,async" if args.workload == "uniform" else "sync,async,partial")).split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    results = {mode: run(mode, args) for mode in modes}
    print(f"\nworkload {args.workload}, {args.steps} steps of {args.groups} tasks x {args.group_size} episodes")
    print(f"{'mode':8s} {'episodes':>9s} {'RL wall s':>10s} {'episodes/s':>11s} {'steps/s':>8s} "
          f"{'trainer idle':>13s} {'turns/ep':>9s} {'dropped':>8s} {'masked tok':>11s} {'re-prefilled':>13s} "
          f"{'aborted':>8s}")
    for mode, r in results.items():
        print(f"{mode:8s} {r['episodes']:9.0f} {r['rl_wall_s']:10.1f} {r['episodes_per_s']:11.2f} "
              f"{r['steps_per_s']:8.3f} {r['idle']:13.1%} {r['turns_mean']:9.2f} {r['evicted']:8.0f} "
              f"{r['masked_tokens']:11.0f} {r['reprefilled']:13.0f} {r['aborted']:8.0f}")
    if "sync" in results:
        base = results["sync"]
        for mode in [m for m in results if m != "sync"]:
            r = results[mode]
            print(f"{mode} / sync: episodes/s {r['episodes_per_s'] / max(base['episodes_per_s'], 1e-9):.2f}x, "
                  f"steps/s {r['steps_per_s'] / max(base['steps_per_s'], 1e-9):.2f}x "
                  f"(trainer idle {base['idle']:.0%} -> {r['idle']:.0%})")


if __name__ == "__main__":
    main()
