"""LoRA against full fine-tuning with ``TorchTrainer``: step time, peak memory, pushed bytes.

For the tiny model and a ~100M-parameter random Qwen3 (``weight_sync_bench.qwen3_100m``: hidden 768,
12 layers, vocab 32k; random init from a config, nothing downloaded) it runs GRPO steps on one fixed
random batch with full fine-tuning and with ``trainer.lora`` (rank 16, alpha 32, the seven projections of
every block), each configuration in its own process so that peak memory is its own:

- ``step ms``: median wall time of a ``train_step`` (after one warm-up step) over ``--steps`` steps;
- ``peak MiB``: the process's peak resident memory (``ru_maxrss``: Python, torch and the model included)
  on the CPU, ``torch.cuda.max_memory_allocated`` on a GPU;
- ``state MiB``: parameters + gradients + AdamW moments, counted exactly from the tensors;
- ``push MiB`` / ``push ms``: what ``push_weights`` wrote into a ring ``WeightStore`` (the adapter alone
  with LoRA) and how long it took.

    python -m benchmarks.lora_bench [--steps 5] [--skip-large] [--device cpu|cuda] [--threads N]

It prints the CPU model and the load average before and after: on a shared machine the figures move with
the load; compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

LORA = {"rank": 16, "alpha": 32.0}
SHAPES = {"tiny": {"batch": 8, "prompt": 64, "completion": 192},
          "qwen3_100m": {"batch": 4, "prompt": 64, "completion": 192}}


def build(name: str) -> torch.nn.Module:
    from benchmarks.weight_sync_bench import qwen3_100m, tiny_model

    return tiny_model(0) if name == "tiny" else qwen3_100m(0)


def random_batch(vocab: int, batch: int, prompt: int, completion: int) -> list:
    from forge_env.rl.types import TrainSample

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(batch):
        tokens = torch.randint(2, vocab, (prompt + completion,), generator=g).tolist()
        logprobs = (-torch.rand(prompt + completion, generator=g) * 5).tolist()
        out.append(TrainSample(token_ids=tokens, loss_mask=[0] * prompt + [1] * completion, old_logprobs=logprobs,
                               advantage=1.0 if i % 2 else -1.0, reward=float(i % 2), group_id="g"))
    return out


def state_bytes(trainer) -> int:
    params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)
    return params + 3 * trainable  # + gradients + AdamW's two moments


def run_one(name: str, mode: str, steps: int, device: str) -> dict:
    from forge_env.rl.trainer import TorchTrainer
    from forge_env.weights import WeightStore

    model = build(name)
    shape = SHAPES[name]
    samples = random_batch(int(model.config.vocab_size), **shape)
    store = WeightStore(f"lora-bench-{os.getpid()}", backend="ring")
    trainer = TorchTrainer(model, device=device, loss="grpo", lr=1e-5, loss_kwargs={"kl_coef": 0.0},
                           micro_batch_size=shape["batch"], weight_store=store,
                           lora=LORA if mode == "lora" else None)
    try:
        trainer.train_step(samples)  # warm-up: allocator, optimizer state
        times = []
        for _ in range(steps):
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            trainer.train_step(samples)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        pushes = []
        for version in range(3):
            started = time.perf_counter()
            info = trainer.push_weights(version)
            pushes.append(time.perf_counter() - started)
        peak = (torch.cuda.max_memory_allocated() if device == "cuda"
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return {"model": name, "mode": mode, "params": sum(p.numel() for p in trainer.model.parameters()),
                "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
                "step_s": statistics.median(times), "peak_bytes": peak, "state_bytes": state_bytes(trainer),
                "push_bytes": info.num_bytes, "push_s": statistics.median(pushes),
                "tokens": shape["batch"] * (shape["prompt"] + shape["completion"])}
    finally:
        store.clear()


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip-large", action="store_true", help="only the tiny model")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads of each run")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args.steps, args.device)))
        return
    from benchmarks.weight_sync_bench import cpu_model
    from forge_env.utils.machine import describe_machine

    print(f"machine: {describe_machine()}; cpu: {cpu_model()}; device: {args.device}; load: {load_average()}")
    print(f"LoRA: rank {LORA['rank']}, alpha {LORA['alpha']}, q/k/v/o/gate/up/down of every block; "
          f"GRPO steps on one random batch, median of {args.steps}")
    models = ["tiny"] if args.skip_large else ["tiny", "qwen3_100m"]
    header = (f"{'model':<12} {'mode':<5} {'params':>11} {'trainable':>11} {'tokens':>7} {'step ms':>9} "
              f"{'peak MiB':>9} {'state MiB':>10} {'push MiB':>9} {'push ms':>8}")
    print(header)
    for name in models:
        rows = {}
        for mode in ("full", "lora"):
            cmd = [sys.executable, "-m", "benchmarks.lora_bench", "--one", name, mode, "--steps", str(args.steps),
                   "--device", args.device] + (["--threads", str(args.threads)] if args.threads else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            row = rows[mode] = json.loads(out.strip().splitlines()[-1])
            print(f"{name:<12} {mode:<5} {row['params']:>11,} {row['trainable']:>11,} {row['tokens']:>7} "
                  f"{row['step_s'] * 1e3:>9.1f} {row['peak_bytes'] / 2**20:>9.0f} {row['state_bytes'] / 2**20:>10.1f} "
                  f"{row['push_bytes'] / 2**20:>9.2f} {row['push_s'] * 1e3:>8.2f}")
        full, lora = rows["full"], rows["lora"]
        print(f"{'':<12} lora/full: step {lora['step_s'] / full['step_s']:.2f}x, peak "
              f"{lora['peak_bytes'] / full['peak_bytes']:.2f}x, state {lora['state_bytes'] / full['state_bytes']:.2f}x, "
              f"pushed bytes {lora['push_bytes'] / full['push_bytes']:.4f}x")
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
