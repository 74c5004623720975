"""``forge-env eval``: run an environment's tasks against a model and score them; ``--compare`` two runs.

Writes into ``--out``: ``config.json`` (the flags that define the run), ``episodes.jsonl`` (one trajectory per
line, appended as episodes finish), ``summary.json`` (the scores), ``view.html`` (a sample of episodes) and, at the
end, ``episodes.parquet`` (the episodes with config and summary, to share: ``agents.eval.export``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from agents.eval.export import RESULTS_FILE, write_eval_parquet
from agents.eval.metrics import format_compare, format_table, summarize
from agents.eval.runner import EPISODES_FILE, ProgressBar, load_finished, plan_episodes, play_plan, write_json
from agents.trajectory import ERROR_ENDPOINT, read_jsonl

#: The flags that decide which episodes a run plays and how; a resumed run must repeat them.
RUN_DEFINING = ("env_id", "model", "api", "local", "temperature", "top_p", "max_tokens", "seed", "env_kwargs",
                "samples", "max_turns", "max_total_tokens", "stop")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", nargs="?", help="registered environment id, e.g. forge_env/Arithmetic-v0")
    parser.add_argument("--compare", nargs=2, metavar=("DIR1", "DIR2"), help="print two runs' summaries side by side")
    parser.add_argument("--model", help="model name the endpoint serves (with --local: a label for the run)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                                          "(default: $OPENAI_BASE_URL)")
    where.add_argument("--local", metavar="PATH", help="run a local HF checkpoint in this process instead")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions",
                        help="completions: token ids in and out, token-exact (vLLM's server); chat: messages "
                             "through the openai SDK (hosted APIs; evaluation only)")
    parser.add_argument("--tokenizer", help="tokenizer + chat template for token level (default: --model when it "
                                            "is a local checkpoint)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=512, help="max tokens per assistant turn")
    parser.add_argument("--stop", action="append", default=[], metavar="STRING",
                        help="stop a turn at this string (repeatable)")
    parser.add_argument("--max-turns", type=int, default=None, help="assistant turns per episode (default: the env's)")
    parser.add_argument("--max-total-tokens", type=int, default=None, help="token budget of a whole episode")
    parser.add_argument("--n-tasks", type=int, default=20, help="tasks: env seeds SEED .. SEED+N-1")
    parser.add_argument("--samples", type=int, default=1, help="samples per task (pass@k for k up to this)")
    parser.add_argument("--seed", type=int, default=0, help="first env seed; the same seeds give the same tasks")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes (and requests) in flight")
    parser.add_argument("--env-kwargs", default="{}", help="JSON object of environment arguments")
    parser.add_argument("--out", help="output directory (default: evals/<env>--<model>)")
    parser.add_argument("--resume", action="store_true", help="keep the episodes already in --out, play the rest "
                                                              "(endpoint errors are played again)")
    parser.add_argument("--fail-on-errors", action="store_true", help="exit 2 if any episode ended in an error")
    parser.add_argument("--pass-threshold", type=float, default=1.0, help="an episode passes with reward >= this")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request before it is retried")
    parser.add_argument("--max-retries", type=int, default=4, help="retries per request on 429/5xx/connection errors")
    parser.add_argument("--backoff", type=float, default=0.5, help="first retry's backoff in seconds (doubles)")
    parser.add_argument("--session-header", default="X-Session-ID",
                        help="header carrying the episode's session id ('' sends none)")
    parser.add_argument("--view-episodes", type=int, default=16, help="episodes shown in view.html")
    parser.add_argument("--device", default=None, help="device for --local (default: cuda if available)")


def eval_command(args: argparse.Namespace) -> int:
    """Run (or compare) evaluations; the exit code is 2 with ``--fail-on-errors`` when episodes errored."""
    if args.compare:
        return compare_command(*args.compare)
    if not args.env_id or not args.model:
        raise ValueError("forge-env eval needs ENV_ID and --model (or --compare DIR1 DIR2)")
    env_kwargs = json.loads(args.env_kwargs)
    if not isinstance(env_kwargs, dict):
        raise ValueError("--env-kwargs must be a JSON object")
    out = Path(args.out or default_out(args.env_id, args.model))
    summary = asyncio.run(run_eval(args, env_kwargs, out))
    print(format_table(summary, title=f"{args.env_id} · {args.model} · {out}"))
    if args.fail_on_errors and summary["errors"]:
        print(f"forge-env eval: {summary['errors']} episodes ended in an error "
              f"({summary['endpoint_errors']} endpoint errors)", file=sys.stderr)
        return 2
    return 0


def default_out(env_id: str, model: str) -> str:
    def short(name: str) -> str:
        return name.rstrip("/").split("/")[-1] or "run"

    return str(Path("evals") / f"{short(env_id)}--{short(model)}")


def _run_config(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    config = {key: getattr(args, key) for key in RUN_DEFINING}
    config["env_kwargs"] = env_kwargs
    return config


def _check_output(out: Path, config: dict[str, Any], resume: bool) -> None:
    episodes = out / EPISODES_FILE
    if not resume:
        if episodes.exists() and episodes.stat().st_size:
            raise FileExistsError(f"{episodes} already holds episodes; pass --resume to continue that run, "
                                  f"or another --out")
        return
    previous_path = out / "config.json"
    if previous_path.exists():
        previous = json.loads(previous_path.read_text())
        changed = {k: (previous.get(k), v) for k, v in config.items() if previous.get(k) != v}
        if changed:
            details = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            raise ValueError(f"--resume with different run settings ({details}); use another --out")


async def run_eval(args: argparse.Namespace, env_kwargs: dict[str, Any], out: Path) -> dict[str, Any]:
    import forge_env
    from agents.eval.backends import build_backend
    from agents.rollout import EpisodeBudget
    from agents.view import write_html
    from forge_env.generation.base import SamplingParams

    forge_env.spec(args.env_id)  # fail fast, with suggestions, before loading anything
    config = _run_config(args, env_kwargs)
    out.mkdir(parents=True, exist_ok=True)
    _check_output(out, config, args.resume)
    write_json(out / "config.json", config)
    plan = plan_episodes(args.seed, args.n_tasks, args.samples)
    episodes_path = out / EPISODES_FILE
    finished = load_finished(episodes_path, plan) if args.resume else []
    done = {t.episode_id for t in finished}
    todo = [p for p in plan if p.episode_id not in done]

    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                              stop=tuple(args.stop))
    budget = EpisodeBudget(max_turns=args.max_turns, max_total_tokens=args.max_total_tokens)

    def env_factory():
        return forge_env.make(args.env_id, **env_kwargs)

    backend = await build_backend(args, env_factory, sampling, budget)
    progress = ProgressBar(total=len(plan), done=len(finished))
    started = time.perf_counter()
    try:
        if finished:
            print(f"resuming: {len(finished)} episodes kept, {len(todo)} to play", file=sys.stderr)
        new = await play_plan(todo, backend.play, episodes_path, concurrency=args.concurrency, progress=progress)
    finally:
        await backend.close()
    wall_s = time.perf_counter() - started
    trajectories = sorted(finished + new, key=lambda t: (t.group_id, t.episode_id))
    summary = summarize(trajectories, samples=args.samples, pass_threshold=args.pass_threshold, wall_s=wall_s)
    summary.update({"env_id": args.env_id, "model": args.model, "backend": backend.describe, "level": backend.level,
                    "played": len(new), "resumed": len(finished), "endpoint": backend.stats(),
                    "tasks_seeds": [args.seed, args.seed + args.n_tasks - 1]})
    errors = [t for t in trajectories if not t.ok]
    if errors:
        summary["first_errors"] = [{"episode_id": t.episode_id, "kind": t.error_kind, "error": t.error}
                                   for t in errors[:5]]
    write_json(out / "summary.json", summary)
    write_eval_parquet(out / RESULTS_FILE, trajectories, config, summary)
    shown = trajectories[: max(args.view_episodes, 0)]
    write_html(shown, str(out / "view.html"), backend.decode, title=f"{args.env_id} · {args.model}")
    return summary


def compare_command(dir_a: str, dir_b: str) -> int:
    """Print two runs' summaries side by side; warn when they did not play the same tasks."""
    summaries, tasks = [], []
    for directory in (dir_a, dir_b):
        path = Path(directory) / "summary.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; run `forge-env eval ... --out {directory}` first")
        summaries.append(json.loads(path.read_text()))
        episodes = Path(directory) / EPISODES_FILE
        tasks.append({t.group_id: json.dumps(t.task, sort_keys=True) for t in read_jsonl(str(episodes))
                      if t.error_kind != ERROR_ENDPOINT} if episodes.exists() else {})
    labels = [summary.get("model") or Path(d).name for summary, d in zip(summaries, (dir_a, dir_b), strict=True)]
    if labels[0] == labels[1]:
        labels = [Path(dir_a).name, Path(dir_b).name]
    print(format_compare(summaries[0], summaries[1], labels[0], labels[1]))
    common = set(tasks[0]) & set(tasks[1])
    differing = [key for key in common if tasks[0][key] != tasks[1][key]]
    if summaries[0].get("env_id") != summaries[1].get("env_id"):
        print(f"warning: different environments ({summaries[0].get('env_id')} vs {summaries[1].get('env_id')})",
              file=sys.stderr)
    elif differing or set(tasks[0]) != set(tasks[1]):
        print(f"warning: the runs did not play the same tasks ({len(common) - len(differing)} of "
              f"{len(set(tasks[0]) | set(tasks[1]))} tasks match)", file=sys.stderr)
    else:
        print(f"same {len(common)} tasks in both runs")
    return 0
