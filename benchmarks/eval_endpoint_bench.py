"""Episodes per second of the tiny model: in-process ``HFGenerator`` against vLLM's server over HTTP.

The same planned Arithmetic-v0 episodes (same seeds, same sampling) are played twice in one run:

- baseline: the tiny model in this process (``HFGenerator``, batching concurrent requests);
- token-level HTTP: the same checkpoint behind ``vllm serve`` (CPU build, float32, eager), driven by
  ``CompletionsGenerator`` over ``/v1/completions`` with token-id prompts and a sticky ``X-Session-ID``.

It prints episodes/s, tokens/s and the ratio HTTP / in-process. Both are token-exact; the server start
(~20-60 s on CPU) is not counted.

    python -m benchmarks.eval_endpoint_bench [--episodes 48] [--concurrency 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import tempfile
import time
from pathlib import Path

import forge_env
from agents.eval.runner import plan_episodes
from agents.rollout import run_episode
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.models import build_byte_tokenizer, save_tiny_model


async def play(generator, episodes: int, concurrency: int, max_tokens: int) -> tuple[float, int, int]:
    """Seconds to play the plan, sampled tokens, errors."""
    renderer = ChatRenderer(build_byte_tokenizer())
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, stop_token_ids=tuple(range(97, 123)))
    limit = asyncio.Semaphore(concurrency)

    async def one(planned):
        async with limit:
            env = forge_env.make("forge_env/Arithmetic-v0", max_action_chars=1, max_turns=3)
            return await run_episode(env, generator, renderer, seed=planned.env_seed, episode_id=planned.episode_id,
                                     sampling=dataclasses.replace(sampling, seed=planned.sampling_seed))

    plan = plan_episodes(seed=0, n_tasks=episodes, samples=1)
    started = time.perf_counter()
    trajectories = await asyncio.gather(*(one(p) for p in plan))
    elapsed = time.perf_counter() - started
    return elapsed, sum(t.num_sampled_tokens for t in trajectories), sum(not t.ok for t in trajectories)


def report(label: str, episodes: int, elapsed: float, tokens: int, errors: int) -> float:
    rate = episodes / elapsed
    print(f"{label:<28} {rate:8.2f} episodes/s  {tokens / elapsed:9.1f} sampled tokens/s  "
          f"({elapsed:.1f} s, {errors} errors)")
    return rate


async def main(args: argparse.Namespace) -> None:
    import torch

    from forge_env.generation.endpoints import CompletionsGenerator, EndpointConfig
    from forge_env.generation.endpoints.vllm_server import VLLMServer
    from forge_env.generation.hf import HFGenerator, HFGeneratorConfig

    # Intra-op threads of the in-process model; on a shared machine more threads than free cores spin-wait
    # (measured here: 30x slower decode steps with 2 threads under load).
    torch.set_num_threads(args.threads)
    checkpoint = save_tiny_model(Path(tempfile.mkdtemp(prefix="eval-bench-")) / "tiny", seed=0)
    local = HFGenerator.from_pretrained(str(checkpoint), HFGeneratorConfig(max_batch_size=args.concurrency),
                                        device="cpu")
    try:
        await play(local, 4, args.concurrency, args.max_tokens)  # warm-up
        base = report("in-process HFGenerator", args.episodes, *await play(local, args.episodes, args.concurrency,
                                                                            args.max_tokens))
    finally:
        await local.aclose()
    with VLLMServer(checkpoint, served_model_name="tiny", kv_cache_bytes=128 << 20) as server:
        remote = CompletionsGenerator(EndpointConfig(base_url=server.base_url, model="tiny",
                                                     max_concurrency=args.concurrency))
        try:
            await play(remote, 4, args.concurrency, args.max_tokens)  # warm-up
            http = report("token-level HTTP (vLLM)", args.episodes,
                          *await play(remote, args.episodes, args.concurrency, args.max_tokens))
        finally:
            await remote.aclose()
    print(f"ratio HTTP / in-process: {http / base:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the in-process model")
    asyncio.run(main(parser.parse_args()))
