"""Sticky KV sessions vs. re-prefilling every turn, on multi-turn episodes with the HF generator.

An episode: an initial prompt, then per turn the generator samples a fixed number of tokens (``ignore_eos``)
and the "environment" answers with a fixed number of observation tokens; the next prompt is the whole
conversation so far. The same episodes (same model, prompts, observations and seeds) run twice on one
``HFGenerator``: with a session id per episode (sticky: only the new suffix is prefilled) and without
(every turn re-prefills the whole conversation).

Printed per shape and turn count: prefilled tokens and wall time of both runs, their ratios, and the
ideal prefill ratio (every turn re-prefilled vs. only the new suffix). Sticky prefilled tokens include
the one "flush" token per finished session turn (the last sampled token, run through the model so the
session caches it), so the measured ratio is honest against the ideal.

    python benchmarks/kv_session_bench.py                 # shapes A and B, 2/5/10 turns, tiny model
    python benchmarks/kv_session_bench.py --shapes B --turns 5 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass

import torch

from forge_env.generation import HFGenerator, SamplingParams
from forge_env.models import TINY_MODEL_ID, load_model_and_tokenizer


@dataclass(frozen=True)
class Shape:
    name: str
    prompt_tokens: int
    turn_tokens: int
    observation_tokens: int


SHAPES = {
    "A": Shape("A", prompt_tokens=500, turn_tokens=100, observation_tokens=100),
    "B": Shape("B", prompt_tokens=2000, turn_tokens=50, observation_tokens=500),
}


@dataclass
class RunResult:
    prefilled: int
    wall_s: float
    cpu_s: float  # process CPU time (all threads): steadier than wall time on a shared machine


def printable_ids(rng: random.Random, n: int) -> list[int]:
    """``n`` byte tokens of printable ASCII (the tiny tokenizer's ids are byte values)."""
    return [rng.randrange(32, 127) for _ in range(n)]


async def run_episodes(
    generator: HFGenerator, shape: Shape, turns: int, episodes: int, sticky: bool, seed: int
) -> RunResult:
    """Play ``episodes`` concurrent episodes of ``turns`` turns; return prefilled tokens and wall time."""

    async def episode(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        tokens = printable_ids(rng, shape.prompt_tokens)
        session = f"bench-{seed}-{index}" if sticky else None
        for turn in range(turns):
            params = SamplingParams(
                max_tokens=shape.turn_tokens, ignore_eos=True, seed=seed + 7919 * turn + index
            )
            completion = await generator.generate(tokens, params, session_id=session)
            tokens = tokens + completion.token_ids
            if turn + 1 < turns:
                tokens = tokens + printable_ids(rng, shape.observation_tokens)
        if session is not None:
            await generator.release_session(session)

    before = generator.stats()
    start, cpu_start = time.perf_counter(), time.process_time()
    await asyncio.gather(*(episode(i) for i in range(episodes)))
    await generator.wait_idle()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    after = generator.stats()
    prefilled = after["prefilled_tokens"] - before["prefilled_tokens"]
    prefilled += after["flushed_tokens"] - before["flushed_tokens"]
    return RunResult(prefilled, wall, cpu)


def ideal_ratio(shape: Shape, turns: int) -> float:
    """Prefill of re-prefilling every turn / prefill of only each turn's new suffix."""
    every_turn = sum(
        shape.prompt_tokens + t * (shape.turn_tokens + shape.observation_tokens) for t in range(turns)
    )
    suffix_only = shape.prompt_tokens + (turns - 1) * shape.observation_tokens
    return every_turn / suffix_only


async def main_async(args: argparse.Namespace) -> None:
    model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    generator = HFGenerator(model, tokenizer)
    print(
        f"model={args.model} params={sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
        f"device={generator.device} threads={torch.get_num_threads()} episodes={args.episodes} "
        f"repeats={args.repeats} (median times; cpu = process CPU time, steadier on a shared machine)",
        flush=True,
    )
    await run_episodes(generator, SHAPES["A"], 2, 1, True, seed=999)  # warm-up
    header = (
        f"{'shape':5} {'turns':>5} | {'prefill plain':>13} {'prefill sticky':>14} {'ratio':>6} {'ideal':>6} "
        f"{'of ideal':>8} | {'wall plain':>10} {'wall sticky':>11} {'ratio':>6} | "
        f"{'cpu plain':>9} {'cpu sticky':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    try:
        for name in args.shapes:
            shape = SHAPES[name]
            for turns in args.turns:
                plain, sticky = [], []
                for repeat in range(args.repeats):
                    # alternate the order so drift on a shared machine hits both modes alike
                    order = (False, True) if repeat % 2 == 0 else (True, False)
                    for mode in order:
                        result = await run_episodes(generator, shape, turns, args.episodes, mode, seed=repeat)
                        (sticky if mode else plain).append(result)
                p_prefill, s_prefill = plain[0].prefilled, sticky[0].prefilled
                p_wall = statistics.median(r.wall_s for r in plain)
                s_wall = statistics.median(r.wall_s for r in sticky)
                p_cpu = statistics.median(r.cpu_s for r in plain)
                s_cpu = statistics.median(r.cpu_s for r in sticky)
                ratio, ideal = p_prefill / s_prefill, ideal_ratio(shape, turns)
                print(
                    f"{name:5} {turns:5d} | {p_prefill:13d} {s_prefill:14d} {ratio:6.2f} {ideal:6.2f} "
                    f"{ratio / ideal:8.1%} | {p_wall:9.2f}s {s_wall:10.2f}s {p_wall / s_wall:6.2f} | "
                    f"{p_cpu:8.2f}s {s_cpu:9.2f}s {p_cpu / s_cpu:6.2f}",
                    flush=True,
                )
    finally:
        generator.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=TINY_MODEL_ID, help="checkpoint dir, hub id, or the tiny model id")
    parser.add_argument("--device", default=None)
    parser.add_argument("--shapes", nargs="+", default=["A", "B"], choices=sorted(SHAPES))
    parser.add_argument("--turns", nargs="+", type=int, default=[2, 5, 10])
    parser.add_argument("--episodes", type=int, default=1, help="concurrent episodes per run")
    parser.add_argument("--repeats", type=int, default=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
