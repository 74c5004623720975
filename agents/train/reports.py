"""What a training run leaves behind: ``summary.json``, the plot, the HTML view of evaluation episodes,
and the one-line account of its rollout rounds; and clearing an earlier run's outputs."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents.train.checkpoint import LoopState
from agents.train.config import GRPOConfig
from agents.train.metrics import read_metrics
from forge_env.utils.machine import describe_machine


def describe_rounds(state: LoopState, steps: int) -> str:
    """How many optimizer steps the run made, from how many rollout rounds, and how many of those trained."""
    skipped = state.rounds - state.rounds_trainable
    return (f"RL: {state.step} of {steps} steps trained, from {state.rounds} rollout rounds: "
            f"{state.rounds_trainable} gave trainable groups, {skipped} skipped (every group's episodes earned "
            "equal rewards; not counted as steps)")


def write_reports(config: GRPOConfig, result: Any, checkpoint: Path, metrics_path: Path,
                  tokenizer: Any) -> dict[str, str]:
    """summary.json, the plot and the HTML view of some evaluation episodes (``result``: a ``loop.RunResult``)."""
    from agents.train.plots import plot_training
    from agents.view import write_html

    out = Path(config.loop.output_dir)
    files = {"metrics": str(metrics_path), "checkpoint": str(checkpoint)}
    files["plot"] = str(plot_training(read_metrics(metrics_path), out / "training.png",
                                      title=f"GRPO on {config.env.id}"))
    if result.eval_after is not None and config.eval.view_episodes:
        shown = result.eval_after.trajectories[: config.eval.view_episodes]
        files["view"] = write_html(shown, str(out / "eval_episodes.html"), tokenizer.decode,
                                   title=f"held-out episodes after step {result.state.step}")
    state = result.state
    summary = {
        "state": asdict(state),
        "success_before": result.eval_before.success_rate if result.eval_before else None,
        "success_after": result.eval_after.success_rate if result.eval_after else None,
        "wall_s": result.wall_s, "rl_wall_s": result.rl_wall_s, "episodes_per_s": result.episodes_per_s,
        "trainer_idle_fraction": result.trainer_idle_fraction, "stage_s": result.stage_s,
        "steps_planned": config.loop.steps, "rounds": state.rounds, "rounds_trainable": state.rounds_trainable,
        "rounds_skipped": state.rounds - state.rounds_trainable, "rl_stopped": result.rl_stopped,
        "warmup": result.warmup,
        "mode": config.loop.mode, "files": files, "machine": describe_machine(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    files["summary"] = str(out / "summary.json")
    return files


RUN_OUTPUTS = ("metrics.jsonl", "tensorboard", "checkpoints", "summary.json", "training.png", "eval_episodes.html")


def clear_previous_run(output_dir: Path) -> None:
    """Remove what an earlier run left in ``output_dir`` so a fresh run's metrics, plot and checkpoints
    are its own (``loop.resume=true`` keeps and continues them instead). Other files are left alone."""
    found = [output_dir / name for name in RUN_OUTPUTS if (output_dir / name).exists()]
    if not found:
        return
    print(f"[train] {output_dir} holds an earlier run; starting afresh (loop.resume=true would continue it)",
          file=sys.stderr, flush=True)
    for path in found:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
