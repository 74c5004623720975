"""One rank of a multi-rank TitanTrainer run (launched by tests/test_rl_titan.py through torchrun).

Every rank builds the trainer from the same HF checkpoint with FSDP over all ranks, checks its
parameters really are sharded, and runs the fixed batch: the whole batch's gradient, one GRPO
step, a push to the weight store and a DCP checkpoint. Rank 0 writes what the test compares with
one rank: ``metrics.json``, ``grads.safetensors`` and the pushed version 1 in ``weights/``.

    torchrun --standalone --nproc_per_node 2 tests/titan_ranks.py CHECKPOINT OUT [cpu|cuda]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def titan_config(checkpoint: str | Path, dump: str | Path, device: str = "cpu"):
    """The TitanTrainer settings both the 1-rank and the multi-rank runs use (so they are comparable)."""
    from forge_env.rl.titan import TitanTrainerConfig

    return TitanTrainerConfig(
        flavor="hf", hf_assets_path=str(checkpoint), device=device, seq_len=256, pad_to_multiple=8,
        loss="grpo", lr=1e-3, loss_kwargs={"kl_coef": 0.05}, generator_dtype=None, dump_folder=str(dump),
        micro_batch_size=1, mixed_precision_param="float32",
    )  # fmt: skip


def fixed_batch():
    """Four samples (split two per rank on two ranks) with sampler and reference logprobs away from the policy's."""
    from tests.rl_support import LENGTHS, batch_of

    samples = batch_of(LENGTHS)
    g = torch.Generator().manual_seed(1)
    for s in samples:
        s.old_logprobs = [(-3.0 + float(torch.rand((), generator=g))) * m for m in s.loss_mask]
        s.ref_logprobs = [-5.5 + float(torch.rand((), generator=g)) for _ in s.token_ids]
    return samples


def main(checkpoint: str, out: str, device: str = "cpu") -> None:
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor, Shard

    from forge_env.rl.titan import TitanTrainer
    from forge_env.weights import WeightStore

    out_dir = Path(out)
    store = WeightStore("titan-ranks", root=out_dir / "weights")
    trainer = TitanTrainer(titan_config(checkpoint, out_dir / "dump", device), weight_store=store)
    world = torch.distributed.get_world_size()
    sharded = [
        name for name, p in trainer.model.named_parameters()
        if isinstance(p, DTensor) and p.device_mesh.size() == world and isinstance(p.placements[0], Shard)
    ]  # fmt: skip
    batch = fixed_batch()
    grads = trainer.gradients(batch)
    metrics = trainer.train_step(batch)
    trainer.push_weights(1)
    trainer.save(out_dir / "ckpt")
    if trainer.rank == 0:
        save_file({k: v.contiguous() for k, v in grads.items()}, str(out_dir / "grads.safetensors"))
        num_params = len(list(trainer.model.parameters()))
        info = {"world_size": world, "dp_size": trainer.dp_size, "sharded": len(sharded), "params": num_params}
        (out_dir / "metrics.json").write_text(json.dumps({"metrics": metrics, **info}))
    trainer.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
