"""Checkpoints of a training run: the trainer, the replay buffer, and where the loop was.

A checkpoint is a directory ``<output_dir>/checkpoints/step_000012/`` holding ``trainer/`` (the
trainer's own ``save``), ``buffer.json`` (``ReplayBuffer.state_dict``) and ``loop_state.json``
(:class:`LoopState`). It is written under a temporary name and renamed, so a crash mid-save never
leaves a half checkpoint that resume would pick up.

A LoRA run whose warm-up trained every weight (``sft.full_weights``) writes the warmed-up base once,
``<output_dir>/checkpoints/base/model.safetensors``, before RL; its step checkpoints hold the adapter
alone and name that base (``LoopState.base_checkpoint``), which ``load_checkpoint`` loads first.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from forge_env.config import ConfigError
from forge_env.rl.buffer import ReplayBuffer
from forge_env.rl.protocols import Trainer

CHECKPOINT_DIR = "checkpoints"


@dataclass
class LoopState:
    """Where a training run is: the counters a resumed run continues from."""

    step: int = 0
    """Optimizer steps done."""
    policy_version: int = 0
    """Version of the weights the generators hold."""
    next_task: int = 0
    """Data position: training task ``i`` is ``reset(seed=env.seed_start + i)``; tasks before this are done."""
    rounds: int = 0
    """Rollout rounds collected (each round's sampling seeds derive from it)."""
    rounds_trainable: int = 0
    """Rounds with at least one group whose episodes earned unequal rewards. The others carry no learning
    signal: with ``advantages.drop_zero_variance`` they are skipped (they cost their rollouts and are not
    steps)."""
    episodes: int = 0
    tasks: dict[str, Any] = field(default_factory=dict)
    """The task sampler's state (``rollout.curriculum``), e.g. the pass-rate curriculum's history."""
    base_checkpoint: str | None = None
    """The directory under ``checkpoints/`` holding the base weights under the trainer's LoRA adapter
    (written by :func:`save_base_checkpoint` after a full-weight warm-up); None: the base is the model
    the run loads (``model.path``, ``model.seed``)."""


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR


def save_checkpoint(output_dir: str | Path, trainer: Trainer, buffer: ReplayBuffer, state: LoopState) -> Path:
    """Write a checkpoint for ``state.step`` and return its directory."""
    root = checkpoint_root(output_dir)
    final = root / f"step_{state.step:06d}"
    partial = root / f".partial_step_{state.step:06d}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    trainer.save(partial / "trainer")
    (partial / "buffer.json").write_text(json.dumps(buffer.state_dict()))
    (partial / "loop_state.json").write_text(json.dumps(asdict(state), indent=2))
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


BASE_DIR = "base"


def save_base_checkpoint(output_dir: str | Path, trainer: Trainer) -> str:
    """Write the base weights under ``trainer``'s LoRA adapter once, as ``checkpoints/base``; return its name."""
    from forge_env.rl.lora import save_base

    root = checkpoint_root(output_dir)
    final, partial = root / BASE_DIR, root / f".partial_{BASE_DIR}"
    shutil.rmtree(partial, ignore_errors=True)
    save_base(trainer.model, partial)  # type: ignore[attr-defined]
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return BASE_DIR


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``output_dir``, or None."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if (p / "loop_state.json").exists())
    return done[-1] if done else None


def load_checkpoint(path: str | Path, trainer: Trainer, buffer: ReplayBuffer, *,
                    require_base: bool = False) -> LoopState:
    """Restore the trainer and buffer from ``path`` (after the base it names, if any); return the loop state
    to continue from. ``require_base``: a checkpoint that names no base is refused (``ConfigError``)."""
    path = Path(path)
    if not (path / "loop_state.json").exists():
        raise FileNotFoundError(f"{path} is not a training checkpoint (no loop_state.json)")
    state = LoopState(**json.loads((path / "loop_state.json").read_text()))
    if require_base and state.base_checkpoint is None:
        raise ConfigError(f"{path} names no base checkpoint, but sft.full_weights trains the base before the "
                          "adapter: it was not written by this config")
    if state.base_checkpoint is not None:  # the adapter applies to this base, not to the loaded model
        from forge_env.rl.lora import load_base

        load_base(trainer.model, path.parent / state.base_checkpoint)  # type: ignore[attr-defined]
    trainer.load(path / "trainer")
    buffer.load_state_dict(json.loads((path / "buffer.json").read_text()))
    return state
