"""How far a bf16 sampler's logprobs are from an fp32 trainer's, and what each off-policy correction does.

The demo's tiny model samples completions (fp32, CPU); the "sampler" scores them under bf16 autocast (what a
bf16 inference engine does to the same weights), the trainer in fp32. Prints the mismatch metrics and, for
each ``OffPolicyConfig``, the share of sampled tokens truncated / rejected and the mean IS weight.

    python benchmarks/off_policy_mismatch.py [--samples 64] [--tokens 48]
"""

from __future__ import annotations

import argparse

import torch

from forge_env.models import build_tiny_model
from forge_env.rl.off_policy import OffPolicyConfig, off_policy_correction
from forge_env.rl.trainer import TorchTrainer
from forge_env.rl.types import TrainSample

CONFIGS = {
    "off (metrics only)": OffPolicyConfig(),
    "tis=token C=2": OffPolicyConfig(tis="token", tis_cap=2.0),
    "tis=sequence C=2": OffPolicyConfig(tis="sequence", tis_cap=2.0),
    "mis=token [0.5, 2]": OffPolicyConfig(mis="token", mis_high=2.0),
    "mis=sequence [0.5, 2]": OffPolicyConfig(mis="sequence", mis_high=2.0),
    "mis=geometric [0.999, 1.001]": OffPolicyConfig(mis="geometric", mis_low=0.999, mis_high=1.001),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = build_tiny_model(args.seed).eval()
    prompts = torch.randint(3, model.config.vocab_size, (args.samples, 8))
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0, top_p=1.0,
                             max_new_tokens=args.tokens, min_new_tokens=args.tokens, pad_token_id=0)
    samples = [TrainSample(token_ids=row.tolist(), loss_mask=[0] * 8 + [1] * args.tokens,
                           old_logprobs=[0.0] * len(row)) for row in out]
    fp32 = TorchTrainer(model, loss="grpo", device="cpu", precision="fp32").logprobs(samples)
    bf16 = TorchTrainer(model, loss="grpo", device="cpu", precision="bf16").logprobs(samples)
    mask = torch.tensor([s.loss_mask[1:] for s in samples])
    trainer = torch.tensor([row[1:] for row in fp32], dtype=torch.float64)
    sampler = torch.tensor([row[1:] for row in bf16], dtype=torch.float64)
    print(f"{args.samples} samples x {args.tokens} sampled tokens, tiny model (seed {args.seed}), "
          f"trainer fp32 vs sampler bf16 autocast, CPU ({torch.__version__})")
    first = True
    for name, config in CONFIGS.items():
        m = off_policy_correction(trainer, sampler, mask, config).metrics
        if first:
            print(f"mismatch: mean |dlogp| {m['off_policy/mismatch_abs_mean']:.4g}, k3 KL "
                  f"{m['off_policy/mismatch_k3_kl']:.3g}, token ratio in [{m['off_policy/ratio_min']:.4f}, "
                  f"{m['off_policy/ratio_max']:.4f}]")
            print(f"{'correction':32s} {'truncated':>10s} {'rejected':>10s} {'mean weight':>12s}")
            first = False
        print(f"{name:32s} {m['off_policy/tis_truncated_frac']:10.2%} {m['off_policy/mis_masked_frac']:10.2%} "
              f"{m['off_policy/is_weight_mean']:12.4f}")


if __name__ == "__main__":
    main()
