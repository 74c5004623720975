"""The end-of-run picture: reward and success rate, and the loss, against the training step (a PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_training(records: list[dict[str, Any]], path: str | Path, title: str = "GRPO training") -> Path:
    """Draw train reward, eval success rate and train loss from metric records (``MetricsLogger``)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    if train:
        top.plot([r["step"] for r in train], [r.get("rollout/reward_mean", float("nan")) for r in train],
                 label="train reward (mean)", color="tab:blue", alpha=0.7)
    if evals:
        top.plot([r["step"] for r in evals], [r.get("success_rate", float("nan")) for r in evals],
                 marker="o", label="held-out success rate", color="tab:green")
    top.set_ylabel("reward / success")
    top.set_ylim(-0.05, 1.05)
    top.grid(alpha=0.3)
    top.legend(loc="lower right")
    top.set_title(title)
    if train:
        bottom.plot([r["step"] for r in train], [r.get("loss", float("nan")) for r in train], color="tab:red")
    bottom.set_ylabel("loss")
    bottom.set_xlabel("training step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
