"""The two generators side by side on CPU: ``HFGenerator`` (the baseline) against ``VLLMGenerator``.

In one run, one engine at a time:

1. Sampling, tiny model (3.2M parameters): ``--requests`` concurrent requests of ``--prompt-tokens``
   prompt tokens each, ``--max-tokens`` sampled tokens each (``ignore_eos``), after one warm-up round.
   Tokens/s (wall) and CPU-seconds per token, the CPU time of this process and all its children (vLLM's
   engine runs in child processes), and the time to start each generator.
2. Weight updates, a ~100M-parameter Qwen3 (hidden 1024, 8 layers, the byte tokenizer's vocabulary)
   built locally from its config with random weights: ``update_weights(version)`` from a ``WeightStore``
   (the trainer's ``put`` is not timed), median of ``--repeats``, as seconds and state-dict GB/s; for
   vLLM also ``load_state_dict(state_dict)`` (the generator writes the file itself).

Ratios are vLLM over HF. The machine may be shared: CPU-seconds are steadier than wall times.

    python -m benchmarks.generator_bench [--requests 16] [--max-tokens 64] [--repeats 3] [--skip-large]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and its live descendants."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def start_hf(path: Path, weight_source: Any = None, max_batch: int = 64) -> Any:
    from forge_env.generation import HFGenerator, HFGeneratorConfig

    return HFGenerator.from_pretrained(str(path), HFGeneratorConfig(max_batch_size=max_batch), device="cpu",
                                       weight_source=weight_source)


def start_vllm(path: Path, weight_source: Any = None, max_batch: int = 64) -> Any:
    from forge_env.generation.vllm import VLLMGenerator, VLLMGeneratorConfig

    config = VLLMGeneratorConfig(model=str(path), device="cpu", dtype="float32", max_model_len=2048,
                                 kv_cache_memory_bytes=256 << 20, max_num_seqs=max_batch)
    return VLLMGenerator(config, weight_source=weight_source)


async def sampling_round(generator: Any, args: argparse.Namespace, seed: int) -> int:
    from forge_env.generation import SamplingParams

    params = [SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=seed + i)
              for i in range(args.requests)]
    prompts = [[(seed + 7 * i + 13 * j) % 250 for j in range(args.prompt_tokens)] for i in range(args.requests)]
    done = await asyncio.gather(*(generator.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    return sum(len(c.token_ids) for c in done)


async def bench_sampling(name: str, start: Callable[..., Any], path: Path, args: argparse.Namespace) -> dict:
    began = time.perf_counter()
    generator = await asyncio.to_thread(start, path, None, max(args.requests, 8))
    started = time.perf_counter() - began
    try:
        await sampling_round(generator, args, seed=10_000)  # warm-up
        cpu0, wall0 = tree_cpu_seconds(), time.perf_counter()
        tokens = 0
        for r in range(args.repeats):
            tokens += await sampling_round(generator, args, seed=r * 1000)
        wall, cpu = time.perf_counter() - wall0, tree_cpu_seconds() - cpu0
    finally:
        await generator.aclose()
    return {"name": name, "start_s": started, "tokens": tokens, "tok_per_s": tokens / wall, "cpu_per_tok": cpu / tokens}


async def timed(call: Awaitable[Any]) -> float:
    began = time.perf_counter()
    await call
    return time.perf_counter() - began


async def bench_updates(path: Path, args: argparse.Namespace) -> list[tuple[str, float, float]]:
    from forge_env.models import TinyModelConfig, build_tiny_model
    from forge_env.weights import WeightStore

    shape = large_shape()
    store = WeightStore(f"generator-bench-{id(args)}", keep_versions=2)
    state = {k: v.detach() for k, v in build_tiny_model(1, TinyModelConfig(**shape)).state_dict().items()}
    nbytes = store.put(state, 0).num_bytes  # what each update moves (the tied head is stored once per name)
    results = []
    versions = iter(range(1, 1 << 30))
    try:
        for name, start in (("HF", start_hf), ("vLLM", start_vllm)):
            began = time.perf_counter()
            generator = await asyncio.to_thread(start, path, store, 8)
            print(f"  {name} generator started in {time.perf_counter() - began:.1f} s", flush=True)
            try:
                times = []
                for _ in range(args.repeats + 1):  # the first is a warm-up
                    version = next(versions)
                    store.put(state, version)
                    times.append(await timed(generator.update_weights(version)))
                results.append((f"{name} update_weights (WeightStore)", statistics.median(times[1:]), nbytes))
                if name == "vLLM":
                    times = []
                    for _ in range(args.repeats):
                        version = next(versions)
                        times.append(await timed(generator.load_state_dict(state, version)))
                    results.append(("vLLM load_state_dict(state dict)", statistics.median(times), nbytes))
            finally:
                await generator.aclose()
    finally:
        store.clear()
    return results


def large_shape() -> dict[str, int]:
    return {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 2048}


async def main_async(args: argparse.Namespace) -> None:
    from forge_env.models import TinyModelConfig, save_tiny_model

    with tempfile.TemporaryDirectory(prefix="generator-bench-") as tmp:
        tiny = save_tiny_model(Path(tmp) / "tiny", seed=0)
        print(f"sampling, tiny model: {args.requests} concurrent requests x {args.max_tokens} tokens, "
              f"{args.prompt_tokens}-token prompts, {args.repeats} rounds", flush=True)
        rows = [await bench_sampling("HF", start_hf, tiny, args), await bench_sampling("vLLM", start_vllm, tiny, args)]
        print(f"  {'generator':<10} {'start s':>8} {'tokens':>7} {'tokens/s':>9} {'CPU ms/token':>13}")
        for row in rows:
            print(f"  {row['name']:<10} {row['start_s']:8.1f} {row['tokens']:7d} {row['tok_per_s']:9.1f} "
                  f"{row['cpu_per_tok'] * 1e3:13.2f}")
        hf, vllm = rows
        print(f"  vLLM / HF: tokens/s {vllm['tok_per_s'] / hf['tok_per_s']:.2f}x, "
              f"CPU per token {vllm['cpu_per_tok'] / hf['cpu_per_tok']:.2f}x, start {vllm['start_s'] / hf['start_s']:.2f}x")
        if args.skip_large:
            return
        large = save_tiny_model(Path(tmp) / "large", seed=0, config=TinyModelConfig(**large_shape()))
        print(f"\nweight updates, random Qwen3 {describe(large)}, median of {args.repeats}", flush=True)
        results = await bench_updates(large, args)
        base = results[0][1]
        print(f"  {'route':<36} {'seconds':>8} {'GB/s':>6} {'vs HF':>7}")
        for label, seconds, nbytes in results:
            print(f"  {label:<36} {seconds:8.3f} {nbytes / seconds / 1e9:6.2f} {base / seconds:6.2f}x")


def describe(path: Path) -> str:
    from forge_env.weights.safetensors_io import read_safetensors_specs

    specs = read_safetensors_specs(path / "model.safetensors")
    count = sum(_numel(s.shape) for s in specs.values())
    return f"{count / 1e6:.0f}M parameters ({count * 4 / 1e9:.2f} GB fp32)"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-large", action="store_true", help="sampling on the tiny model only")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
