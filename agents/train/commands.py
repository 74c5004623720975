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
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def _print_config(config: object) -> None:
    import yaml

    from forge_env.config import to_dict

    print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")


def _configure_threads() -> None:
    # Several torch processes (trainer, generator replica) share the cores: spinning OpenMP threads
    # waiting for work would steal them from each other.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def train_command(args: argparse.Namespace) -> int:
    """Run the GRPO application of ``args.config``."""
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
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """Run the CPU demo; exit 0 only when it ran to the end (it prints the success rates either way)."""
    from agents.train.config import load_grpo_config
    from agents.train.loop import train
    from forge_env.utils.machine import describe_machine

    config = load_grpo_config(DEMO_CONFIG, args.overrides)
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
    print(f"\nheld-out success rate: before RL {before:.1%}  ->  after RL {after:.1%}  "
          f"({(after - before) * 100:+.1f} points) in {result.wall_s:.0f}s")
    print(f"machine: {describe_machine()} (a tiny model's results depend on the CPU's arithmetic)")
    for name, path in result.files.items():
        print(f"  {name:10s} {path}")
    return 0
