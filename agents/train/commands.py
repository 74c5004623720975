"""The ``forge-env train`` and ``forge-env demo`` subcommands (registered by ``agents/cli.py``).

``forge-env train CONFIG.yaml key.sub=value ...`` runs a GRPO application; ``forge-env demo`` runs the
embedded CPU demo config (``agents/train/configs/demo.yaml``) and checks that RL improved the policy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"
#: ``forge-env demo --lora``: the same demo with RL training a LoRA adapter instead of every weight. The
#: warm-up trains every weight, as without LoRA (``sft.full_weights``: an adapter alone on the random tiny
#: model does not learn to copy, docs/training.md "LoRA"); the adapter is attached after it. An adapter
#: moves fewer weights per step, so RL's learning rate is higher.
LORA_DEMO_OVERRIDES = ["trainer.config.lora={rank: 32, alpha: 64}", "trainer.config.lr=2.0e-3",
                       "sft.full_weights=true", "loop.output_dir=runs/demo_lora"]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML file of the GRPO application (see examples/)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted overrides, e.g. loop.steps=20 trainer.config.lr=1e-5")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--job", metavar="SPEC",
                        help="a Monarch job whose host groups the config's *.hosts name: a .py file defining "
                             "`job` (e.g. job = SlurmJob({'cpu': 8, 'gpu': 2}, ...)), a module.attr path, or a "
                             "job state file written by job.dump() (see docs/cluster.md)")


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted overrides of the demo config, e.g. loop.output_dir=runs/mine")
    parser.add_argument("--lora", action="store_true",
                        help="RL trains a LoRA adapter (rank 32) on the warmed-up model instead of every weight (the "
                             "warm-up still trains every weight); RL pushes send the adapter alone (docs/training.md, LoRA)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def _print_config(config: object) -> None:
    import yaml

    from forge_env.config import to_dict

    print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")


def _configure_threads() -> None:
    # Several torch processes (trainer, generator replica) share the cores: spinning OpenMP threads
    # waiting for work would steal them from each other. This reaches the processes started from here
    # (generator and environment replicas), not this one: libgomp read its environment when the config's
    # import loaded torch. That is kept on purpose: the trainer's back-to-back SFT steps run about 30%
    # faster with libgomp's default spin-then-sleep than PASSIVE on a quiet 2-core machine (its threads
    # wake within microseconds between ops), but ~16x slower when another busy torch process shares the
    # cores (docs/training.md, "Where the demo's time goes": a trade-off still to decide).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


#: ``forge-env demo``'s exit status when RL stopped without ever finding a group to train on.
EXIT_NO_LEARNING_SIGNAL = 3
#: ... when RL stopped early (too many rounds in a row without a step) after training some steps.
EXIT_RL_STOPPED = 4


def train_command(args: argparse.Namespace) -> int:
    """Run the GRPO application of ``args.config``; non-zero when RL stopped before its steps."""
    from agents.train.config import load_grpo_config
    from agents.train.loop import train

    overrides = list(args.overrides) + ([f"job={args.job}"] if args.job else [])
    config = load_grpo_config(args.config, overrides)
    if args.print_config:
        _print_config(config)
        return 0
    _configure_threads()
    result = asyncio.run(train(config))
    print(f"done: {result.state.step} steps in {result.wall_s:.0f}s; outputs in {result.output_dir}")
    for name, path in result.files.items():
        print(f"  {name:10s} {path}")
    if result.rl_stopped:
        print(f"RL stopped early: {result.rl_stopped}", file=sys.stderr)
        return EXIT_NO_LEARNING_SIGNAL if result.state.step == 0 else EXIT_RL_STOPPED
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """Run the CPU demo; exit 0 only when RL ran all its steps (it prints the success rates either way).

    Exit 3 (:data:`EXIT_NO_LEARNING_SIGNAL`) when RL never found a group to train on, 4 when it stopped
    early after some steps.
    """
    from agents.train.config import load_grpo_config
    from agents.train.loop import train
    from agents.train.reports import describe_rounds
    from forge_env.utils.machine import describe_machine

    lora = LORA_DEMO_OVERRIDES if getattr(args, "lora", False) else []
    config = load_grpo_config(DEMO_CONFIG, [*lora, *args.overrides])
    if args.print_config:
        _print_config(config)
        return 0
    _configure_threads()
    print("forge-env demo: tiny Qwen3-architecture model, SFT warm-up on Arithmetic-v0 expert demonstrations, "
          f"then {config.loop.steps} GRPO steps against the environment served on Monarch "
          f"({config.env.service.backend} backend). Takes a few minutes on 2 CPU cores.", file=sys.stderr, flush=True)
    result = asyncio.run(train(config))
    before = result.eval_before.success_rate if result.eval_before else float("nan")
    after = result.eval_after.success_rate if result.eval_after else float("nan")
    print()
    if "tool_rate" in result.warmup:
        w = result.warmup
        print(f"warm-up: first-turn tool-call rate {w['tool_rate_before_mix']:.1%} -> {w['tool_rate']:.1%} after "
              f"{w['mixed_steps']:.0f} mixed steps ({w['mixed_backoffs']:.0f} undone for falling below the floor)")
    print(describe_rounds(result.state, config.loop.steps))
    print(f"held-out success rate: before RL {before:.1%}  ->  after RL {after:.1%}  "
          f"({(after - before) * 100:+.1f} points) in {result.wall_s:.0f}s")
    print(f"machine: {describe_machine()} (a tiny model's results depend on the CPU's arithmetic)")
    for name, path in result.files.items():
        print(f"  {name:10s} {path}")
    if result.rl_stopped and result.state.step == 0:
        state = result.state
        found = ("never found a trainable group (every group's episodes earned equal rewards in all "
                 f"{state.rounds} rounds)" if not state.rounds_trainable else
                 f"found trainable groups in only {state.rounds_trainable} of {state.rounds} rounds, too few to "
                 "fill one batch")
        print(f"\nforge-env demo FAILED: RL {found}, so it trained nothing and the policy did not change. "
              f"{result.rl_stopped}", file=sys.stderr)
        return EXIT_NO_LEARNING_SIGNAL
    if result.rl_stopped:
        print(f"\nforge-env demo stopped early: {result.rl_stopped}", file=sys.stderr)
        return EXIT_RL_STOPPED
    return 0
