"""Each loss against values computed by hand on tiny tensors: values, gradients, clip
boundaries, masked positions, aggregation modes and metrics."""

import math

import pytest
import torch

from forge_env.rl.losses import (
    LOSSES,
    aggregate,
    cispo_loss,
    dapo_loss,
    get_loss,
    grpo_loss,
    gspo_loss,
    k3_kl,
    ppo_clip_loss,
    reinforce_loss,
    sft_loss,
)

approx = pytest.approx


def policy(logprobs, ratios):
    """Leaf ``logprobs`` with gradient and ``old`` such that exp(logprobs - old) == ratios."""
    lp = torch.tensor([logprobs], dtype=torch.float64, requires_grad=True)
    old = lp.detach() - torch.log(torch.tensor([ratios], dtype=torch.float64))
    return lp, old


# ------------------------------------------------------------------ aggregation


def test_aggregation_modes_by_hand():
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert aggregate(values, mask, "token_mean").item() == approx((1 + 2 + 3) / 3)
    assert aggregate(values, mask, "seq_mean").item() == approx(((1 + 2) / 2 + 3) / 2)
    assert aggregate(values, mask, "fixed_horizon", horizon=4).item() == approx(6 / (2 * 4))
    # Global denominators: micro-batch losses add up to the batch loss.
    assert aggregate(values, mask, "token_mean", num_tokens=6).item() == approx(1.0)
    assert aggregate(values, mask, "seq_mean", num_seqs=4).item() == approx(4.5 / 4)
    with pytest.raises(ValueError, match="horizon"):
        aggregate(values, mask, "fixed_horizon")
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(values, mask, "sum")  # type: ignore[arg-type]


def test_masked_inf_and_nan_never_reach_loss_or_grad():
    lp = torch.tensor([[-1.0, float("nan"), -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, float("-inf"), -2.0]])
    mask = torch.tensor([[1, 0, 1]])
    out = ppo_clip_loss(lp, old, torch.tensor([1.0]), mask, aggregation="token_mean")
    out.loss.backward()
    assert out.loss.item() == approx(-1.0)  # ratio 1 on both sampled tokens
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[0, 1] == 0
    assert math.isfinite(out.metrics["ratio_max"])


# ------------------------------------------------------------------ PPO / GRPO / DAPO


def test_ppo_clip_positive_advantage_boundaries():
    # A = +1, clip 0.2/0.2: r just inside 1.2 is not clipped, just outside is; the lower
    # clip never binds for A > 0 (min picks the unclipped, more pessimistic term).
    ratios = [0.5, 1.2 - 1e-6, 1.2 + 1e-6, 1.5, 7.0]
    lp, old = policy([-1.0, -2.0, -0.5, -1.5, -3.0], ratios)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    out = ppo_clip_loss(lp, old, torch.tensor([1.0]), mask, aggregation="token_mean")
    per_token = [-0.5, -(1.2 - 1e-6), -1.2, -1.2]
    assert out.loss.item() == approx(sum(per_token) / 4)
    out.loss.backward()
    # d/dlp of -A r is -A r (unclipped); clipped tokens and the masked one get no gradient.
    expected = torch.tensor([[-0.5 / 4, -(1.2 - 1e-6) / 4, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(lp.grad, expected)
    m = out.metrics
    assert m["clip_frac"] == approx(2 / 4)
    assert m["clip_high_frac"] == approx(2 / 4)
    assert m["clip_low_frac"] == 0.0
    assert m["ratio_min"] == approx(0.5) and m["ratio_max"] == approx(1.5)  # masked 7.0 ignored
    assert m["ratio_mean"] == approx((0.5 + 1.2 - 1e-6 + 1.2 + 1e-6 + 1.5) / 4)


def test_ppo_clip_negative_advantage_boundaries():
    # A = -2, clip_low 0.2: r below 0.8 is clipped (loss pinned at 2 * 0.8), r above 1 + clip is not.
    ratios = [0.8 + 1e-6, 0.8 - 1e-6, 0.5, 1.5]
    lp, old = policy([-1.0, -1.0, -1.0, -1.0], ratios)
    mask = torch.ones(1, 4)
    out = ppo_clip_loss(lp, old, torch.tensor([-2.0]), mask, aggregation="token_mean")
    per_token = [2 * (0.8 + 1e-6), 2 * 0.8, 2 * 0.8, 2 * 1.5]
    assert out.loss.item() == approx(sum(per_token) / 4)
    out.loss.backward()
    expected = torch.tensor([[2 * (0.8 + 1e-6) / 4, 0.0, 0.0, 2 * 1.5 / 4]], dtype=torch.float64)
    assert torch.allclose(lp.grad, expected)
    assert out.metrics["clip_low_frac"] == approx(0.5)
    assert out.metrics["clip_high_frac"] == 0.0


def test_asymmetric_clip_high_dapo_defaults():
    # DAPO: clip_high 0.28 lets r = 1.25 through (PPO's 0.2 would clip it); token-mean over both rows.
    lp = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    old = -torch.log(torch.tensor([[1.25, 1.0], [1.0, 9.0]], dtype=torch.float64))
    mask = torch.tensor([[1, 1], [1, 0]])
    out = dapo_loss(lp, old, torch.tensor([1.0, 1.0]), mask)
    assert out.loss.item() == approx(-(1.25 + 1.0 + 1.0) / 3)
    assert out.metrics["clip_frac"] == 0.0
    ppo = ppo_clip_loss(lp, old, torch.tensor([1.0, 1.0]), mask, aggregation="token_mean")
    assert ppo.loss.item() == approx(-(1.2 + 1.0 + 1.0) / 3)


def test_grpo_k3_kl_term_and_seq_mean():
    # Two sequences; policy == sampler (r = 1), A = [1, -1]; ref - lp = [ln 2, 0 | 0].
    lp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    old = lp.detach().clone()
    ref = lp.detach() + torch.tensor([[math.log(2.0), 0.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    out = grpo_loss(lp, old, torch.tensor([1.0, -1.0]), mask, ref_logprobs=ref, kl_coef=0.1)
    k3 = 2.0 - math.log(2.0) - 1.0
    pg = ((-1 - 1) / 2 + 1.0) / 2  # seq means: -1 and +1 -> 0
    kl = ((k3 + 0.0) / 2 + 0.0) / 2
    assert out.metrics["pg_loss"] == approx(pg)
    assert out.loss.item() == approx(pg + 0.1 * kl)
    assert out.metrics["kl"] == approx(k3 / 3)  # token mean over the 3 sampled tokens
    out.loss.backward()
    # d k3 / d lp = 1 - exp(ref - lp) = 1 - 2 = -1 on the first token.
    assert lp.grad[0, 0].item() == approx(-1 / 2 / 2 + 0.1 * (-1.0) / 2 / 2)
    assert lp.grad[1, 1].item() == 0.0


def test_k3_is_zero_when_equal_and_positive_otherwise():
    lp = torch.tensor([-1.0, -2.0, -3.0])
    assert torch.allclose(k3_kl(lp, lp), torch.zeros(3))
    assert (k3_kl(lp, lp + torch.tensor([0.5, -0.5, 1.0])) > 0).all()


def test_per_token_advantages_are_accepted():
    lp, old = policy([-1.0, -1.0], [1.0, 1.0])
    out = ppo_clip_loss(lp, old, torch.tensor([[2.0, -1.0]]), torch.ones(1, 2), aggregation="token_mean")
    assert out.loss.item() == approx((-2.0 + 1.0) / 2)


# ------------------------------------------------------------------ GSPO


def test_gspo_sequence_ratio_inside_clip():
    # Sequence ratio is the geometric mean of token ratios: sqrt(1.0004 * 1.0) ~= 1.0002 (inside 4e-4).
    lp, old = policy([-1.0, -2.0, -3.0], [1.0004, 1.0, 50.0])
    mask = torch.tensor([[1, 1, 0]])
    out = gspo_loss(lp, old, torch.tensor([1.0]), mask)
    s = math.sqrt(1.0004)
    assert out.loss.item() == approx(-s)
    assert out.metrics["seq_ratio_mean"] == approx(s)
    assert out.metrics["clip_frac"] == 0.0
    out.loss.backward()
    # GSPO-token: d/dlp_t (-A sg(s) exp(lp_t - sg(lp_t))) = -A s, then seq-mean over 2 tokens.
    assert torch.allclose(lp.grad, torch.tensor([[-s / 2, -s / 2, 0.0]], dtype=torch.float64))


def test_gspo_sequence_ratio_clipped():
    lp, old = policy([-1.0, -2.0], [1.1, 1.3])  # s = sqrt(1.43) ~ 1.196, far above 1 + 4e-4
    out = gspo_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert out.loss.item() == approx(-(1 + 4e-4))
    assert out.metrics["clip_frac"] == 1.0
    out.loss.backward()
    assert torch.count_nonzero(lp.grad) == 0


# ------------------------------------------------------------------ CISPO / REINFORCE / SFT


def test_cispo_clips_detached_weight_but_keeps_gradient():
    lp, old = policy([-1.0, -2.0, -4.0], [0.5, 2.0, 3.0])
    mask = torch.tensor([[1, 1, 0]])
    out = cispo_loss(lp, old, torch.tensor([2.0]), mask, clip_high=0.28)
    # weights sg(clip(r, max=1.28)) = [0.5, 1.28]; loss_t = -w A lp
    assert out.loss.item() == approx((-0.5 * 2 * -1.0 + -1.28 * 2 * -2.0) / 2)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5 * 2 / 2, -1.28 * 2 / 2, 0.0]], dtype=torch.float64))
    assert out.metrics["clip_frac"] == approx(0.5)
    assert out.metrics["is_weight_mean"] == approx((0.5 + 1.28) / 2)


def test_cispo_lower_clip_when_given():
    lp, old = policy([-1.0], [0.5])
    out = cispo_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2)
    assert out.loss.item() == approx(-0.8 * -1.0)
    assert out.metrics["clip_low_frac"] == 1.0


def test_reinforce_truncated_importance_weights():
    lp, old = policy([-1.0, -2.0], [0.5, 3.0])
    out = reinforce_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 2), is_cap=2.0)
    # w = [0.5, min(3, 2) = 2]; loss_t = -w A lp = w lp (A = -1)
    assert out.loss.item() == approx((0.5 * -1.0 + 2.0 * -2.0) / 2)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[0.5 / 2, 2.0 / 2]], dtype=torch.float64))
    assert out.metrics["clip_high_frac"] == approx(0.5)
    plain = reinforce_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 2), is_cap=None)
    assert plain.loss.item() == approx((0.5 * -1.0 + 3.0 * -2.0) / 2)


def test_sft_cross_entropy_and_entropy_metric():
    lp = torch.tensor([[-0.5, -1.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    entropy = torch.tensor([[1.0, 3.0, 100.0]])
    out = sft_loss(lp, None, None, mask, entropy=entropy)
    assert out.loss.item() == approx(1.0)
    assert out.metrics["nll"] == approx(1.0)
    assert out.metrics["entropy"] == approx(2.0)
    out.loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, -0.5, 0.0]]))


def test_loss_registry():
    assert set(LOSSES) == {"grpo", "ppo", "dapo", "gspo", "cispo", "reinforce", "sft"}
    assert get_loss("gspo") is gspo_loss
    with pytest.raises(ValueError, match="unknown loss"):
        get_loss("trpo")


def test_empty_mask_gives_zero_loss_not_nan():
    lp, old = policy([-1.0, -2.0], [1.0, 1.0])
    for fn in LOSSES.values():
        out = fn(lp, old, torch.tensor([1.0]), torch.zeros(1, 2))
        assert out.loss.item() == 0.0, fn.__name__
        assert all(math.isfinite(v) for v in out.metrics.values()), fn.__name__


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("poisoned", ["advantages", "logprobs", "old_logprobs", "ref_logprobs", "all"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_masked_nan_and_inf_reach_neither_loss_nor_gradient(name, poisoned, bad):
    """Whatever a masked position holds, loss and gradient equal those with zeros there (docs/rl.md)."""
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0]])
    clean = {
        "logprobs": torch.tensor([[-1.0, -0.5, 0.0, -2.0, 0.0], [0.0, -0.3, -1.2, 0.0, 0.0]]),
        "old_logprobs": torch.tensor([[-1.1, -0.4, 0.0, -1.9, 0.0], [0.0, -0.35, -1.0, 0.0, 0.0]]),
        "advantages": torch.tensor([[0.5, 0.5, 0.0, 0.5, 0.0], [0.0, -1.0, -1.0, 0.0, 0.0]]),
        "ref_logprobs": torch.tensor([[-1.2, -0.6, 0.0, -2.1, 0.0], [0.0, -0.2, -1.1, 0.0, 0.0]]),
    }

    def run(inputs):
        logprobs = inputs["logprobs"].clone().requires_grad_(True)
        kwargs = {} if name == "sft" else {"ref_logprobs": inputs["ref_logprobs"], "kl_coef": 0.1}
        out = get_loss(name)(logprobs, inputs["old_logprobs"], inputs["advantages"], mask, **kwargs)
        out.loss.backward()
        return out.loss.detach(), logprobs.grad

    dirty = {key: value.clone() for key, value in clean.items()}
    for key in dirty if poisoned == "all" else [poisoned]:
        dirty[key][mask == 0] = bad
    loss, grad = run(dirty)
    expected_loss, expected_grad = run(clean)
    assert torch.isfinite(grad).all(), grad
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, expected_grad)


def test_grpo_and_dapo_are_ppo_clip_presets_with_their_defaults():
    """The presets equal ppo_clip_loss with their family's settings, and their signatures show those defaults
    (the trainer and the config read ``kl_coef``'s default from the signature)."""
    import inspect

    lp, old = policy([-1.0, -2.0, -0.5], [1.5, 0.7, 1.25])
    ref = lp.detach() + torch.tensor([[0.3, -0.2, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1]])
    adv = torch.tensor([1.0])
    settings = {
        grpo_loss: dict(clip_low=0.2, clip_high=0.2, kl_coef=0.04, aggregation="seq_mean"),
        dapo_loss: dict(clip_low=0.2, clip_high=0.28, kl_coef=0.0, aggregation="token_mean"),
    }
    for fn, defaults in settings.items():
        params = inspect.signature(fn).parameters
        assert {name: params[name].default for name in defaults} == defaults, fn.__name__
        assert list(params) == list(inspect.signature(ppo_clip_loss).parameters)
        out = fn(lp, old, adv, mask, ref_logprobs=ref)
        expected = ppo_clip_loss(lp, old, adv, mask, ref_logprobs=ref, **defaults)
        assert out.loss.item() == approx(expected.loss.item()) and out.metrics == approx(expected.metrics)
        overridden = fn(lp, old, adv, mask, ref_logprobs=ref, clip_high=0.5, kl_coef=0.3)
        expected = ppo_clip_loss(lp, old, adv, mask, ref_logprobs=ref, **{**defaults, "clip_high": 0.5, "kl_coef": 0.3})
        assert overridden.loss.item() == approx(expected.loss.item())
        with pytest.raises(TypeError):
            fn(lp, old, adv, mask, clip=0.1)
    assert grpo_loss.__name__ == "grpo_loss" and "GRPO" in grpo_loss.__doc__
    import pickle

    assert pickle.loads(pickle.dumps(dapo_loss)) is dapo_loss  # by reference, like a plain function (actors)
