"""Off-policy correction (TIS / MIS, token / sequence / geometric) against a loop-by-loop reference.

The reference below is written independently of ``forge_env.rl.off_policy``: plain Python loops over
floats, from the definitions (Yao et al.'s TIS ``min(pi_old / pi_sampler, C)``; MIS zeroes what lies
outside ``[lo, hi]``), for the weights, every loss's value and gradient, and the mismatch metrics.
"""

from __future__ import annotations

import math

import pytest
import torch

from forge_env.rl.losses import get_loss
from forge_env.rl.off_policy import OffPolicyConfig, off_policy_correction, with_off_policy_correction
from forge_env.rl.trainer import TorchTrainer, TrainerConfig
from tests.rl_support import LENGTHS, batch_of, on_policy, tiny_model

approx = pytest.approx

CONFIGS = [
    OffPolicyConfig(tis="token", tis_cap=1.5),
    OffPolicyConfig(tis="sequence", tis_cap=2.0),
    OffPolicyConfig(mis="token", mis_high=1.3),
    OffPolicyConfig(mis="token", mis_low=0.9, mis_high=1.2),
    OffPolicyConfig(mis="sequence", mis_high=2.0),
    OffPolicyConfig(mis="geometric", mis_low=0.95, mis_high=1.05),
    OffPolicyConfig(tis="token", tis_cap=1.2, mis="geometric", mis_low=0.9, mis_high=1.1),
    OffPolicyConfig(tis="sequence", tis_cap=1.5, mis="token", mis_high=1.5),
]


def random_case(seed: int, b: int = 5, t: int = 7):
    """Trainer logprobs (leaf, float64), sampler logprobs a bit off, ragged masks, per-sequence advantages."""
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.05
    old = lp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.25
    mask = torch.zeros(b, t, dtype=torch.long)
    for i in range(b):
        start = int(torch.randint(0, 3, (1,), generator=g))
        end = int(torch.randint(start + 1, t + 1, (1,), generator=g))
        mask[i, start:end] = 1
    mask[-1] = 0  # a sequence with no sampled tokens
    lp = lp.masked_fill(mask == 0, float("nan"))  # garbage where nothing was sampled
    old = old.masked_fill(mask == 0, float("-inf"))
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    return lp.requires_grad_(True), old, adv, mask


# ------------------------------------------------------------------ the reference


def ref_weights(lp, old, mask, cfg: OffPolicyConfig) -> list[list[float]]:
    b, t = mask.shape
    low = cfg.mis_low if cfg.mis_low is not None else 1.0 / cfg.mis_high
    out = []
    for i in range(b):
        toks = [j for j in range(t) if mask[i, j]]
        log_rho = {j: float(lp[i, j].detach()) - float(old[i, j]) for j in toks}
        seq_log = sum(log_rho.values())
        geo_log = seq_log / len(toks) if toks else 0.0
        row = []
        for j in range(t):
            if j not in log_rho:
                row.append(0.0)
                continue
            w = 1.0
            if cfg.tis == "token":
                w = min(math.exp(log_rho[j]), cfg.tis_cap)
            elif cfg.tis == "sequence":
                w = min(math.exp(seq_log), cfg.tis_cap)
            if cfg.mis == "token":
                x = math.exp(log_rho[j])
            elif cfg.mis == "sequence":
                x = math.exp(seq_log)
            elif cfg.mis == "geometric":
                x = math.exp(geo_log)
            else:
                x = 1.0
            if cfg.mis is not None and not (low <= x <= cfg.mis_high):
                w = 0.0
            row.append(w)
        out.append(row)
    return out


def ref_loss(name, lp, old, adv, mask, cfg, aggregation, ref=None, kl_coef=0.0):
    """(value, d value / d lp) of loss ``name`` under ``cfg``'s correction, by loops.

    With the correction, the loss's ratio is taken against the trainer's own detached logprobs, so it is 1:
    PPO/GRPO/DAPO/GSPO's per-token term is ``-w A`` (gradient ``-w A``), CISPO/REINFORCE's ``-w A logp``
    (gradient ``-w A``). The k3 KL term is not weighted.
    """
    b, t = mask.shape
    w = ref_weights(lp, old, mask, cfg)
    terms = [[0.0] * t for _ in range(b)]
    grads = [[0.0] * t for _ in range(b)]
    for i in range(b):
        for j in range(t):
            if not mask[i, j]:
                continue
            a, x = float(adv[i]), float(lp[i, j])
            terms[i][j] = -w[i][j] * a * (x if name in ("cispo", "reinforce") else 1.0)
            grads[i][j] = -w[i][j] * a
            if ref is not None and kl_coef:
                d = float(ref[i, j]) - x
                terms[i][j] += kl_coef * (math.exp(d) - d - 1.0)
                grads[i][j] += kl_coef * (1.0 - math.exp(d))
    n_tok = sum(int(mask[i, j]) for i in range(b) for j in range(t))
    value = 0.0
    grad = [[0.0] * t for _ in range(b)]
    for i in range(b):
        n_i = sum(int(mask[i, j]) for j in range(t))
        for j in range(t):
            if not mask[i, j]:
                continue
            scale = 1.0 / n_tok if aggregation == "token_mean" else 1.0 / (max(n_i, 1) * b)
            value += terms[i][j] * scale
            grad[i][j] = grads[i][j] * scale
    return value, grad


def ref_metrics(lp, old, mask, cfg):
    b, t = mask.shape
    w = ref_weights(lp, old, mask, cfg)
    n = abs_sum = k3_sum = 0.0
    for i in range(b):
        for j in range(t):
            if mask[i, j]:
                d = float(lp[i, j].detach()) - float(old[i, j])
                n += 1
                abs_sum += abs(d)
                k3_sum += math.exp(d) - 1.0 - d
    return {"off_policy/mismatch_abs_mean": abs_sum / n, "off_policy/mismatch_k3_kl": k3_sum / n,
            "off_policy/is_weight_mean": sum(w[i][j] for i in range(b) for j in range(t) if mask[i, j]) / n}


def ref_fractions(lp, old, mask, cfg):
    """(truncated, masked) shares of sampled tokens, from the definitions."""
    uncapped = OffPolicyConfig(tis=cfg.tis, tis_cap=1e30, mis=cfg.mis, mis_high=cfg.mis_high, mis_low=cfg.mis_low)
    w_capped = ref_weights(lp, old, mask, cfg)
    w_free = ref_weights(lp, old, mask, uncapped)
    no_mis = OffPolicyConfig(tis=cfg.tis, tis_cap=cfg.tis_cap)
    w_nomask = ref_weights(lp, old, mask, no_mis)
    b, t = mask.shape
    cells = [(i, j) for i in range(b) for j in range(t) if mask[i, j]]
    masked = sum(w_nomask[i][j] > 0 and w_capped[i][j] == 0 for i, j in cells)
    truncated = sum(w_free[i][j] > cfg.tis_cap for i, j in cells)
    return truncated / len(cells), masked / len(cells)


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"tis={c.tis}-mis={c.mis}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_and_metrics_match_the_reference(cfg, seed):
    lp, old, _, mask = random_case(seed)
    out = off_policy_correction(lp, old, mask, cfg)
    expected = ref_weights(lp, old, mask, cfg)
    assert out.weights.tolist() == [[approx(v, rel=1e-6, abs=1e-9) for v in row] for row in expected]
    for key, value in ref_metrics(lp, old, mask, cfg).items():
        assert out.metrics[key] == approx(value, rel=1e-6), key
    truncated, masked = ref_fractions(lp, old, mask, cfg)
    assert out.metrics["off_policy/tis_truncated_frac"] == approx(truncated)
    assert out.metrics["off_policy/mis_masked_frac"] == approx(masked)


def test_the_random_cases_exercise_every_branch():
    """The cases above truncate, mask and keep something (else the comparison would prove little)."""
    hits = {"trunc": 0, "mask": 0, "keep": 0}
    for cfg in CONFIGS:
        for seed in (0, 1, 2):
            lp, old, _, mask = random_case(seed)
            m = off_policy_correction(lp, old, mask, cfg).metrics
            hits["trunc"] += m["off_policy/tis_truncated_frac"] > 0
            hits["mask"] += m["off_policy/mis_masked_frac"] > 0
            hits["keep"] += m["off_policy/mis_masked_frac"] < 1
    assert all(v >= 3 for v in hits.values()), hits


@pytest.mark.parametrize("loss", ["grpo", "dapo", "ppo", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"tis={c.tis}-mis={c.mis}")
def test_every_loss_composes_with_every_correction(loss, cfg):
    base = get_loss(loss)
    corrected = with_off_policy_correction(base, cfg)
    for seed, aggregation in [(3, "token_mean"), (4, "seq_mean")]:
        lp, old, adv, mask = random_case(seed)
        out = corrected(lp, old, adv, mask, aggregation=aggregation, kl_coef=0.0)
        out.loss.backward()
        value, grad = ref_loss(loss, lp, old, adv, mask, cfg, aggregation)
        assert out.loss.item() == approx(value, rel=1e-6, abs=1e-12)
        assert torch.isfinite(lp.grad).all()
        assert lp.grad.tolist() == [[approx(v, rel=1e-6, abs=1e-12) for v in row] for row in grad]
        assert "off_policy/mismatch_k3_kl" in out.metrics


def test_the_kl_penalty_is_added_unweighted():
    cfg = OffPolicyConfig(tis="token", tis_cap=1.2, mis="token", mis_high=1.3)
    lp, old, adv, mask = random_case(5)
    ref = (lp.detach() + 0.1).nan_to_num(0.0)
    out = with_off_policy_correction(get_loss("grpo"), cfg)(lp, old, adv, mask, ref_logprobs=ref, kl_coef=0.3,
                                                             aggregation="token_mean")
    out.loss.backward()
    value, grad = ref_loss("grpo", lp, old, adv, mask, cfg, "token_mean", ref=ref, kl_coef=0.3)
    assert out.loss.item() == approx(value, rel=1e-6)
    assert lp.grad.tolist() == [[approx(v, rel=1e-6, abs=1e-12) for v in row] for row in grad]


@pytest.mark.parametrize("loss", ["grpo", "gspo", "cispo"])
def test_without_a_correction_the_loss_is_unchanged_and_metrics_are_added(loss):
    lp, old, adv, mask = random_case(6)
    plain = get_loss(loss)(lp, old, adv, mask, kl_coef=0.0)
    wrapped = with_off_policy_correction(get_loss(loss), None)(lp, old, adv, mask, kl_coef=0.0)
    assert wrapped.loss.item() == plain.loss.item()
    assert {k: v for k, v in wrapped.metrics.items() if not k.startswith("off_policy/")} == plain.metrics
    expected = ref_metrics(lp, old, mask, OffPolicyConfig())
    assert wrapped.metrics["off_policy/mismatch_abs_mean"] == approx(expected["off_policy/mismatch_abs_mean"])
    assert wrapped.metrics["off_policy/mis_masked_frac"] == 0.0
    assert wrapped.metrics["off_policy/is_weight_mean"] == 1.0


def test_on_policy_tokens_get_weight_one_and_match_the_plain_gradient():
    """Sampler == trainer: TIS/MIS weights are 1 and the corrected PPO gradient is the plain one."""
    lp, _, adv, mask = random_case(7)
    old = lp.detach().clone()
    cfg = OffPolicyConfig(tis="sequence", mis="geometric", mis_low=0.999, mis_high=1.001)
    out = with_off_policy_correction(get_loss("dapo"), cfg)(lp, old, adv, mask)
    out.loss.backward()
    g_corrected = lp.grad.clone()
    lp.grad = None
    get_loss("dapo")(lp, old, adv, mask).loss.backward()
    assert torch.allclose(g_corrected, lp.grad)
    assert out.metrics["off_policy/mismatch_abs_mean"] == 0.0
    assert out.metrics["off_policy/is_weight_mean"] == 1.0


def test_config_checks_and_coercion():
    assert OffPolicyConfig.coerce({"tis": "token"}).tis == "token"
    assert OffPolicyConfig(mis="token", mis_high=4.0).low == 0.25
    for bad, match in [({"tis": "seq"}, "off_policy.tis"), ({"mis": "tokens"}, "off_policy.mis"),
                       ({"tis_cap": 0}, "tis_cap"), ({"mis_low": 3.0}, "mis_low")]:
        with pytest.raises(ValueError, match=match):
            OffPolicyConfig(**bad)
    with pytest.raises(ValueError, match="unknown option"):
        OffPolicyConfig.coerce({"tis_capp": 2.0})
    # TrainerConfig carries it (also as the plain dict dataclasses.asdict makes of it).
    assert TrainerConfig(off_policy={"mis": "geometric"}).off_policy.mis == "geometric"


def test_trainer_step_with_tis_and_mis_reports_the_mismatch():
    cfg = OffPolicyConfig(tis="token", tis_cap=1.5, mis="token", mis_low=0.5, mis_high=3.0)
    trainer = TorchTrainer(tiny_model(), device="cpu", loss="dapo", lr=1e-3, micro_batch_size=2, off_policy=cfg)
    samples = on_policy(trainer, batch_of(LENGTHS))
    g = torch.Generator().manual_seed(0)
    for s in samples:  # the sampler disagrees with the trainer: some tokens beyond the cap, some rejected
        s.old_logprobs = [v + float(torch.randn(1, generator=g)) * 0.6 if m else 0.0
                          for v, m in zip(s.old_logprobs, s.loss_mask, strict=True)]
    trainer_lp = trainer.logprobs(samples)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    m = trainer.train_step(samples)
    assert m["skipped_step"] == 0.0 and m["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters(), strict=True))
    # The metrics equal the reference's over the whole batch (micro-batches combined token-weighted).
    width = max(s.num_tokens for s in samples) - 1
    lp = torch.zeros(len(samples), width, dtype=torch.float64)
    old = torch.zeros_like(lp)
    mask = torch.zeros(len(samples), width, dtype=torch.long)
    for i, (s, row) in enumerate(zip(samples, trainer_lp, strict=True)):
        n = s.num_tokens - 1
        lp[i, :n] = torch.tensor(row[1:], dtype=torch.float64)
        old[i, :n] = torch.tensor(s.old_logprobs[1:], dtype=torch.float64)
        mask[i, :n] = torch.tensor(s.loss_mask[1:])
    for key, value in ref_metrics(lp, old, mask, cfg).items():
        assert m[key] == approx(value, rel=1e-3), key
    truncated, masked = ref_fractions(lp, old, mask, cfg)
    assert 0 < truncated < 1 and 0 < masked < 1
    assert m["off_policy/tis_truncated_frac"] == approx(truncated)
    assert m["off_policy/mis_masked_frac"] == approx(masked)
    assert m["clip_frac"] == 0.0  # the PPO ratio is against the trainer's own pre-step logprobs


def test_trainer_without_a_correction_still_reports_the_mismatch_and_sft_does_not():
    trainer = TorchTrainer(tiny_model(), device="cpu", loss="grpo", lr=1e-3, loss_kwargs={"kl_coef": 0.0})
    samples = on_policy(trainer, batch_of(LENGTHS))
    m = trainer.train_step(samples)
    assert m["off_policy/mismatch_abs_mean"] == approx(0.0, abs=1e-5)
    assert m["off_policy/mis_masked_frac"] == 0.0
    sft = TorchTrainer(tiny_model(), device="cpu", loss="sft", lr=1e-3, off_policy={"tis": "token"})
    assert not any(k.startswith("off_policy/") for k in sft.train_step(batch_of(LENGTHS)))
