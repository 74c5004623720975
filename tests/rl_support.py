"""Shared pieces for the RL-core tests: a tiny random Qwen3 model and sample builders."""

from __future__ import annotations

import torch

from forge_env.models import TinyModelConfig, build_tiny_model
from forge_env.rl.types import TrainSample

#: Smaller than the demo's tiny model so every test step takes milliseconds.
SMALL = TinyModelConfig(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=512,
)  # fmt: skip
VOCAB = SMALL.vocab_size


def tiny_model(seed: int = 0):
    """A ~70k-parameter random Qwen3 from the tiny model kit (byte-tokenizer vocabulary), seeded."""
    return build_tiny_model(seed, SMALL)


def sample(
    prompt: list[int],
    completion: list[int],
    *,
    old_logprobs: list[float] | None = None,
    advantage: float = 0.0,
    reward: float = 0.0,
    group_id: str | None = None,
    episode_id: str | None = None,
    policy_versions: list[int] | None = None,
) -> TrainSample:
    """A single-turn sample: prompt tokens (unmasked) followed by sampled completion tokens."""
    tokens = prompt + completion
    mask = [0] * len(prompt) + [1] * len(completion)
    if old_logprobs is None:
        old_logprobs = [0.0] * len(tokens)
    return TrainSample(
        token_ids=tokens,
        loss_mask=mask,
        old_logprobs=old_logprobs,
        advantage=advantage,
        reward=reward,
        group_id=group_id,
        episode_id=episode_id,
        policy_versions=policy_versions or [],
    )


#: (prompt, completion) lengths of the standard test batch.
LENGTHS = [(3, 5), (6, 2), (2, 9), (4, 4)]


def batch_of(lengths, seed=0, advantages=None):
    """Random single-turn samples of the given (prompt, completion) lengths, advantages +1/-1 alternating."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (p, c) in enumerate(lengths):
        toks = torch.randint(2, VOCAB, (p + c,), generator=g).tolist()
        adv = advantages[i] if advantages else (1.0 if i % 2 == 0 else -1.0)
        out.append(sample(toks[:p], toks[p:], advantage=adv, group_id="g", episode_id=f"e{i}"))
    return out


def on_policy(trainer, samples):
    """Give samples the trainer's own logprobs as sampler logprobs (ratio 1)."""
    for s, lp in zip(samples, trainer.logprobs(samples), strict=True):
        s.old_logprobs = [v if m else 0.0 for v, m in zip(lp, s.loss_mask, strict=True)]
    return samples
