"""What a weight update landing mid-episode costs the episode's next turn: the re-prefill.

Under partial rollouts (``loop.partial_rollouts``) an episode in flight goes on with the new weights from
its next turn. The KV cache its sticky session holds was computed by the old weights, so ``HFGenerator``
drops it at the update (``keep_sessions_on_update: false``), and the next turn prefills its whole prompt
again instead of only the env's reply. This measures that turn both ways on the tiny model, in process,
for a few context lengths: a turn whose prompt extends the cached context by ``--suffix`` tokens, with the
cache (no update in between) and after an update (the same weights reloaded under a new version).

    python -m benchmarks.reprefill_bench [--contexts 128,512,1536] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time

from forge_env.generation.base import SamplingParams
from forge_env.generation.hf import HFGenerator
from forge_env.models import TINY_MODEL_ID, load_model_and_tokenizer


async def one_turn(generator: HFGenerator, context: int, args: argparse.Namespace, update: bool,
                   episode: str) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (this process) and prefilled tokens of the second turn of a session whose first prompt has ``context`` tokens."""
    rng = random.Random(context)
    prompt = [rng.randrange(256) for _ in range(context)]
    turn = SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=0)
    first = await generator.generate(prompt, turn, session_id=episode)
    await generator.wait_idle()  # the session's cache is stored
    if update:
        state = {k: v.clone() for k, v in generator.model.state_dict().items()}
        await generator.load_state_dict(state, generator.policy_version + 1)
    second = prompt + first.token_ids + [rng.randrange(256) for _ in range(args.suffix)]
    before = generator.stats()["prefilled_tokens"]
    started, cpu = time.perf_counter(), time.process_time()
    await generator.generate(second, turn, session_id=episode)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    await generator.release_session(episode)
    return seconds, cpu, generator.stats()["prefilled_tokens"] - before


async def main_async(args: argparse.Namespace) -> None:
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL_ID, seed=0)
    generator = HFGenerator(model, tokenizer)
    try:
        await one_turn(generator, 64, args, False, "warm-up")
        print(f"tiny model, HFGenerator on CPU; second turn = {args.suffix} new prompt tokens + {args.tokens} "
              f"sampled; median of {args.repeats}")
        print(f"{'context':>8s} {'wall ms: cached':>16s} {'re-prefill':>11s} {'x':>6s}   {'CPU ms: cached':>15s} "
              f"{'re-prefill':>11s} {'x':>6s}   prefilled tokens (cached / re-prefill)")
        for context in args.contexts:
            wall: dict[bool, list[float]] = {False: [], True: []}
            cpu: dict[bool, list[float]] = {False: [], True: []}
            prefilled = {}
            for i in range(args.repeats):
                for update in (False, True):
                    seconds, cpu_s, tokens = await one_turn(generator, context, args, update, f"e{context}-{i}-{update}")
                    wall[update].append(seconds)
                    cpu[update].append(cpu_s)
                    prefilled[update] = tokens
            w0, w1 = statistics.median(wall[False]), statistics.median(wall[True])
            c0, c1 = statistics.median(cpu[False]), statistics.median(cpu[True])
            print(f"{context:8d} {w0 * 1e3:16.1f} {w1 * 1e3:11.1f} {w1 / w0:6.2f}   {c0 * 1e3:15.1f} {c1 * 1e3:11.1f} "
                  f"{c1 / c0:6.2f}   {prefilled[False]} / {prefilled[True]}")
    finally:
        generator.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="128,512,1536")
    parser.add_argument("--suffix", type=int, default=16, help="prompt tokens the env's reply adds")
    parser.add_argument("--tokens", type=int, default=8, help="tokens sampled per turn")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    args.contexts = [int(c) for c in args.contexts.split(",")]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
