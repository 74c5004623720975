"""The agent-side subcommands of ``forge-env``: ``rollout`` (episodes to Parquet or JSONL) and ``view`` (to HTML).

``agents/cli.py`` registers them and imports this module only when one runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents.groups import GroupRequest, Progress, stream_groups
from agents.rollout import EpisodeBudget
from agents.trajectory_table import JSONL_SUFFIXES, PARQUET_SUFFIXES, read_trajectories, write_trajectories
from agents.view import write_html


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="registered environment id, e.g. forge_env/Arithmetic-v0")
    parser.add_argument("--model", default="forge-env/tiny-qwen3",
                        help="HF checkpoint directory or hub id (default: the built-in tiny model, random weights)")
    parser.add_argument("--n", type=int, default=8, help="number of episodes")
    parser.add_argument("--group-size", type=int, default=1, help="episodes per task (GRPO group); n must divide")
    parser.add_argument("--out", required=True, help="output file of trajectories: .parquet (the schema in docs/ecosystem.md, loads as a "
                             "datasets.Dataset) or .jsonl (one trajectory JSON object a line)")
    parser.add_argument("--seed", type=int, default=0, help="first env seed (task k uses seed + k)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=256, help="max tokens per assistant turn")
    parser.add_argument("--max-total-tokens", type=int, default=None, help="token budget of a whole episode")
    parser.add_argument("--env-kwargs", default="{}", help="JSON object of environment arguments")
    parser.add_argument("--replicas", type=int, default=0,
                        help="serve the env as an EnvService with this many Monarch replicas (0: in-process)")
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")


def rollout_command(args: argparse.Namespace) -> int:
    """Run episodes of ``args.env_id`` with a model and write their trajectories to ``args.out``."""
    if args.n < 1 or args.group_size < 1 or args.n % args.group_size:
        raise ValueError(f"--n ({args.n}) must be a positive multiple of --group-size ({args.group_size})")
    if Path(args.out).suffix.lower() not in PARQUET_SUFFIXES + JSONL_SUFFIXES:
        raise ValueError(f"--out {args.out}: the file must end in .parquet or .jsonl")
    env_kwargs = json.loads(args.env_kwargs)
    if not isinstance(env_kwargs, dict):
        raise ValueError("--env-kwargs must be a JSON object")
    trajectories = asyncio.run(_rollout(args, env_kwargs))
    write_trajectories(trajectories, args.out)
    rewards = [t.reward for t in trajectories]
    errors = sum(not t.ok for t in trajectories)
    print(f"wrote {len(trajectories)} trajectories to {args.out}: mean reward {sum(rewards) / len(rewards):.3f}, "
          f"{errors} errors")
    return 0


async def _rollout(args: argparse.Namespace, env_kwargs: dict) -> list:
    import forge_env
    from forge_env.chat import ChatRenderer
    from forge_env.generation import make_generator
    from forge_env.generation.base import SamplingParams

    forge_env.spec(args.env_id)  # fail fast, with suggestions, before loading a model
    generator: Any = make_generator("hf", model=args.model, config={"max_batch_size": args.concurrency},
                                    device=args.device)
    renderer = ChatRenderer(generator.tokenizer)  # the tool-call parser is detected from the chat template
    if isinstance(renderer.parser, str) and renderer.parser != "hermes":  # hermes is every env's default
        env_kwargs = {"tool_parser": renderer.parser, **env_kwargs}
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                              seed=args.seed)
    budget = EpisodeBudget(max_total_tokens=args.max_total_tokens)
    requests = [GroupRequest(seed=args.seed + k, n=args.group_size, group_id=f"task{args.seed + k}")
                for k in range(args.n // args.group_size)]
    progress = Progress(every_s=10.0, label="rollout")
    service = None
    try:
        if args.replicas > 0:
            from forge_env.services import EnvService

            service = await EnvService.launch(args.env_id, num_replicas=args.replicas, env_kwargs=env_kwargs)
            env_factory = service.env
        else:
            def env_factory():
                return forge_env.make(args.env_id, **env_kwargs)
        trajectories = []
        async for group in stream_groups(requests, env_factory, generator, renderer, sampling=sampling, budget=budget,
                                         max_episodes_in_flight=args.concurrency, env_id=args.env_id,
                                         progress=progress):
            trajectories.extend(group)
        print(progress.summary(), file=sys.stderr)
        return sorted(trajectories, key=lambda t: t.episode_id)
    finally:
        if service is not None:
            await service.shutdown()
        await generator.aclose()


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trajectories file (.jsonl or .parquet) written by `forge-env rollout` "
                                         "(or the training loop)")
    parser.add_argument("--out", default=None, help="HTML file to write (default: FILE with .html)")
    parser.add_argument("--model", default="forge-env/tiny-qwen3", help="checkpoint whose tokenizer decodes the tokens")
    parser.add_argument("--limit", type=int, default=None, help="show at most this many episodes")


def view_command(args: argparse.Namespace) -> int:
    """Write the static HTML view of a trajectories file."""
    from forge_env.models import load_tokenizer

    trajectories = read_trajectories(args.file)[: args.limit]
    tokenizer = load_tokenizer(args.model)
    out = args.out or str(Path(args.file).with_suffix(".html"))
    write_html(trajectories, out, lambda ids: tokenizer.decode(ids, skip_special_tokens=False), title=Path(args.file).name)
    print(f"wrote {out} ({len(trajectories)} episodes)")
    return 0
