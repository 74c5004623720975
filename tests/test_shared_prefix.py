"""TorchTrainer(share_prefix=True): the leading tokens every sample of a micro-batch shares run once.

The demo's batches all open with the same system prompt and question stem (61 of ~173 tokens), a GRPO
group's samples with the same prompt; running them once per micro-batch instead of once per sample is a
speed-up (about a fifth of an SFT step on CPU), not a change of the math: the logprobs, the loss and its
gradient are the plain forward's up to float rounding, and so are the demo's first SFT steps.
"""

import asyncio
import copy

import pytest
import torch

from forge_env.rl.batching import collate
from forge_env.rl.logprobs import MIN_SHARED_PREFIX, model_token_logprobs, shared_prefix_length
from forge_env.rl.trainer import TorchTrainer
from tests.rl_support import VOCAB, sample, tiny_model


def _prefixed_batch(prefix_len: int = 24, tails=((5, 7), (9, 3), (2, 12), (6, 6)), seed: int = 0):
    """Samples sharing ``prefix_len`` leading tokens, then (prompt rest, completion) of different lengths."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(2, VOCAB, (prefix_len,), generator=g).tolist()
    out = []
    for i, (rest, completion) in enumerate(tails):
        toks = torch.randint(2, VOCAB, (rest + completion,), generator=g).tolist()
        out.append(sample(shared + toks[:rest], toks[rest:], advantage=1.0 if i % 2 else -1.0))
    return out


def test_the_shared_prefix_is_what_all_rows_share_and_leaves_every_row_a_token_of_its_own():
    samples = _prefixed_batch(prefix_len=20)
    inputs, _ = collate(samples, pad_token_id=0)
    assert shared_prefix_length(inputs) == 20
    # Rows that differ at their first token share nothing; one row alone, or a packed batch, shares nothing.
    assert shared_prefix_length(collate(_prefixed_batch(prefix_len=0), pad_token_id=0)[0]) == 0
    assert shared_prefix_length(collate(samples[:1], pad_token_id=0)[0]) == 0
    assert shared_prefix_length(collate(samples, pad_token_id=0, packing=True)[0]) == 0
    # Identical rows: the last token stays each row's own, so every row's logits come from its own pass.
    same = [copy.deepcopy(samples[0]) for _ in range(3)]
    assert shared_prefix_length(collate(same, pad_token_id=0)[0]) == samples[0].num_tokens - 1


def test_logprobs_and_gradients_with_a_shared_prefix_match_the_plain_forward():
    samples = _prefixed_batch(prefix_len=MIN_SHARED_PREFIX + 8)
    inputs, lt = collate(samples, pad_token_id=0)
    results = []
    for share in (False, True):
        model = tiny_model()
        logprobs, entropy = model_token_logprobs(model, inputs, with_entropy=True, share_prefix=share)
        (-(logprobs * lt.loss_mask).sum()).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        mask = lt.loss_mask.bool()
        results.append((logprobs[mask], entropy[mask], grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    assert float(g0.norm()) > 0
    # float32 sums in another order: the absolute error scales with the largest gradient (7.4 here with the
    # tiny model's init std of 0.05; a small entry differed by 1.2e-6 against 1e-6 allowed before the scaling)
    torch.testing.assert_close(g1, g0, atol=1e-6 * float(g0.abs().max()), rtol=1e-4)


def test_a_short_shared_prefix_runs_the_plain_forward():
    samples = _prefixed_batch(prefix_len=MIN_SHARED_PREFIX - 1)
    inputs, _ = collate(samples, pad_token_id=0)
    model = tiny_model()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    model_token_logprobs(model, inputs, share_prefix=True)
    assert len(calls) == 1  # one forward over the whole batch, not prefix + rest


@pytest.mark.parametrize("loss", ["sft", "grpo"])
def test_train_steps_with_a_shared_prefix_match_the_plain_ones(loss):
    batches = [_prefixed_batch(prefix_len=30, seed=s) for s in range(4)]
    runs = []
    for share in (False, True):
        trainer = TorchTrainer(tiny_model(), device="cpu", loss=loss, lr=3e-3, micro_batch_size=2,
                               loss_kwargs={"kl_coef": 0.0} if loss == "grpo" else {}, share_prefix=share)
        runs.append([trainer.train_step(copy.deepcopy(b)) for b in batches])
    for plain, shared in zip(*runs, strict=True):
        assert shared["loss"] == pytest.approx(plain["loss"], rel=1e-4, abs=1e-6)
        assert shared["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)


def test_the_demo_warm_up_s_first_steps_lose_the_same_with_a_shared_prefix():
    """The demo's own model, demonstrations and SFT settings (``demo.yaml`` keeps share_prefix off until the
    seeds benchmark has measured it; this checks what turning it on would do): the first steps' losses are the
    plain forward's up to rounding."""
    from agents.sft import demonstration_samples
    from agents.train.commands import DEMO_CONFIG
    from agents.train.config import load_grpo_config
    from agents.train.tool_gate import batches
    from agents.train.warmup import expert_demonstrations
    from forge_env.chat import ChatRenderer
    from forge_env.models import load_model_and_tokenizer

    config = load_grpo_config(DEMO_CONFIG, ["sft.num_demonstrations=64", "trainer.config.share_prefix=true"])
    assert config.trainer.config.share_prefix
    model, tokenizer = load_model_and_tokenizer(config.model.path, seed=config.model.seed)
    demos = asyncio.run(expert_demonstrations(config.env.id, config.env.kwargs, config.sft))
    samples = demonstration_samples(demos, ChatRenderer(tokenizer))
    assert shared_prefix_length(collate(samples[:8], pad_token_id=0)[0]) >= MIN_SHARED_PREFIX
    losses = []
    for share in (False, True):
        trainer = TorchTrainer(copy.deepcopy(model), config.trainer.config, loss="sft", lr=config.sft.lr,
                               temperature=1.0, loss_kwargs={}, lr_schedule=config.sft.lr_schedule, share_prefix=share)
        draw = batches(samples, config.sft.batch_size, 0)
        losses.append([trainer.train_step(next(draw))["loss"] for _ in range(4)])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
