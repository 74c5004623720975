"""How closely TitanTrainer (torchtitan) agrees with TorchTrainer (transformers), and 2 ranks with 1.

On the tests' tiny Qwen3 (a HF checkpoint written to a temporary directory) and their fixed GRPO
batch (KL term on, sampler logprobs off-policy), it prints for one step:

- TitanTrainer (1 rank) against TorchTrainer: the loss difference, the largest per-parameter
  gradient relative L2 error, and the largest weight relative L2 error after the AdamW step;
- TitanTrainer on N ranks (torchrun, FSDP sharding every parameter; gloo on the CPU) against 1 rank:
  the same three figures.

    python -m benchmarks.titan_parity [--ranks 2] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def rel_l2(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    return max(
        float((got[k].float() - v.float()).norm() / v.float().norm().clamp_min(1e-12)) for k, v in expected.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()

    from safetensors.torch import load_file

    from forge_env.models import save_tiny_model
    from forge_env.rl.titan import TitanTrainer
    from forge_env.rl.trainer import TorchTrainer
    from forge_env.weights import WeightStore
    from tests.rl_support import SMALL, tiny_model
    from tests.titan_ranks import fixed_batch, titan_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        checkpoint = save_tiny_model(tmp_path / "hf", seed=0, config=SMALL)
        cfg = titan_config(checkpoint, tmp_path / "dump", args.device)
        titan = TitanTrainer(cfg)
        reference = TorchTrainer(
            tiny_model(), device=args.device, packing=True, precision="fp32", loss=cfg.loss, lr=cfg.lr,
            loss_kwargs=cfg.loss_kwargs, micro_batch_size=cfg.micro_batch_size,
        )  # fmt: skip
        batch = fixed_batch()
        titan_grads = titan.gradients(batch)
        reference.compute_loss(batch).loss.backward()
        torch_grads = {n: p.grad.detach().cpu() for n, p in reference.model.named_parameters()}
        reference.optimizer.zero_grad(set_to_none=True)
        ours, theirs = titan.train_step(batch), reference.train_step(batch)
        weights = titan.state_dict_for_generators()
        print(f"device {args.device}, torch {torch.__version__}")
        print("TitanTrainer (1 rank) vs TorchTrainer, one GRPO step:")
        print(f"  loss {ours['loss']:.7f} vs {theirs['loss']:.7f} (|diff| {abs(ours['loss'] - theirs['loss']):.1e})")
        print(f"  gradients: max per-parameter relative L2 {rel_l2(titan_grads, torch_grads):.1e}")
        print(f"  weights after the step: max relative L2 {rel_l2(weights, reference.state_dict_for_generators()):.1e}")

        out = tmp_path / "ranks"
        out.mkdir()
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
               str(ROOT / "tests" / "titan_ranks.py"), str(checkpoint), str(out), args.device]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        result = json.loads((out / "metrics.json").read_text())
        many_grads = load_file(str(out / "grads.safetensors"))
        pushed = WeightStore("titan-ranks", root=out / "weights").load(1)
        loss = result["metrics"]["loss"]
        print(f"TitanTrainer {args.ranks} ranks (FSDP, {result['sharded']}/{result['params']} parameters sharded) vs 1 rank:")
        print(f"  loss {loss:.7f} vs {ours['loss']:.7f} (|diff| {abs(loss - ours['loss']):.1e})")
        print(f"  gradients: max per-parameter relative L2 {rel_l2(many_grads, titan_grads):.1e}")
        print(f"  weights after the step: max relative L2 {rel_l2(pushed, weights):.1e}")
        titan.close()


if __name__ == "__main__":
    main()
