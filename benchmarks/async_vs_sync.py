"""The same small GRPO job in the synchronous and the asynchronous loop: throughput and trainer idle time.

Both runs use the tiny model, Arithmetic-v0 on a Monarch environment replica, a generator service in its
own process, the replay buffer, the trainer and weight sync, with identical sizes and seeds. It prints,
per mode, episodes/s over the RL phase, the trainer's idle fraction (sync: the share of time spent not
training, i.e. waiting for rollouts; async: time the trainer waited for a batch) and the mean policy lag
of trained-on samples, then the async/sync ratio of episodes/s.

    python -m benchmarks.async_vs_sync [--steps 8] [--group-size 8] [--groups 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile

from agents.train.config import load_grpo_config
from agents.train.loop import train
from agents.train.metrics import read_metrics


def job(mode: str, out: str, args: argparse.Namespace) -> list[str]:
    return [
        f"loop.mode={mode}", f"loop.steps={args.steps}", f"loop.output_dir={out}", "loop.seed=0",
        "env.kwargs={num_operands: 2, digits: 2, operators: '+-*', max_turns: 3}",
        f"rollout.group_size={args.group_size}", f"rollout.groups_per_step={args.groups}",
        "rollout.max_turns=3", "rollout.sampling.max_tokens=64",
        f"buffer.batch_size={args.group_size * args.groups}", "buffer.max_policy_age=1",
        "advantages.drop_zero_variance=false", "trainer.config.lr=1e-4", "trainer.config.device=cpu",
        "trainer.config.loss_kwargs.kl_coef=0",
        f"trainer.config.micro_batch_size={args.group_size * args.groups}",
        "generator.service=true", "generator.device=cpu", "eval.num_tasks=0",
        "logging.tensorboard=false", "logging.progress=false", "sft.enabled=false",
    ]


def run(mode: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        config = load_grpo_config(None, job(mode, out, args))
        result = asyncio.run(train(config))
        steps = [r for r in read_metrics(os.path.join(out, "metrics.jsonl")) if r["kind"] == "train"]
    return {"episodes_per_s": result.episodes_per_s, "idle": result.trainer_idle_fraction,
            "episodes": float(result.state.episodes), "rl_wall_s": result.rl_wall_s, "steps": float(len(steps))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    results = {mode: run(mode, args) for mode in ("sync", "async")}
    print(f"\n{'mode':6s} {'episodes':>9s} {'RL wall s':>10s} {'episodes/s':>11s} {'trainer idle':>13s}")
    for mode, r in results.items():
        print(f"{mode:6s} {r['episodes']:9.0f} {r['rl_wall_s']:10.1f} {r['episodes_per_s']:11.2f} {r['idle']:13.1%}")
    ratio = results["async"]["episodes_per_s"] / max(results["sync"]["episodes_per_s"], 1e-9)
    print(f"\nasync / sync episodes/s: {ratio:.2f}x  (trainer idle {results['sync']['idle']:.0%} -> "
          f"{results['async']['idle']:.0%})")


if __name__ == "__main__":
    main()
