"""An evaluation run's results as one Parquet file (or a ``datasets.Dataset``) to share.

``forge-env eval`` writes ``episodes.parquet`` next to ``episodes.jsonl`` when a run ends: one row per episode in
the trajectory schema (``agents.trajectory_table``, documented in ``docs/ecosystem.md``), with the run's
``config.json`` and ``summary.json`` in the file's key-value metadata (``forge_env.eval_config``,
``forge_env.eval_summary``). :func:`load_eval` reads that file, or a run directory written before it existed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.trajectory import Trajectory, read_jsonl
from agents.trajectory_table import parquet_metadata, read_parquet, to_dataset, write_parquet

if TYPE_CHECKING:
    import datasets

RESULTS_FILE = "episodes.parquet"


@dataclass
class EvalResults:
    """The episodes of an evaluation run, the flags that defined it and its scores."""

    trajectories: list[Trajectory]
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dataset(self) -> datasets.Dataset:
        return to_dataset(self.trajectories)


def write_eval_parquet(path: str | Path, trajectories: Sequence[Trajectory], config: dict[str, Any],
                       summary: dict[str, Any]) -> None:
    """One Parquet file holding the run's episodes, with its config and summary in the file metadata."""
    write_parquet(trajectories, path, metadata={"eval_config": config, "eval_summary": summary})


def load_eval(path: str | Path) -> EvalResults:
    """An eval run from its Parquet file, or from its directory (``episodes.parquet``, else ``episodes.jsonl``
    with ``config.json`` and ``summary.json``)."""
    path = Path(path)
    if path.is_dir():
        if (path / RESULTS_FILE).exists():
            return load_eval(path / RESULTS_FILE)
        episodes = path / "episodes.jsonl"
        if not episodes.exists():
            raise FileNotFoundError(f"{path} holds neither {RESULTS_FILE} nor episodes.jsonl: not an eval run")
        return EvalResults(read_jsonl(str(episodes)), _json_file(path / "config.json"), _json_file(path / "summary.json"))
    metadata = parquet_metadata(path) if path.exists() else {}
    trajectories = read_parquet(path)
    return EvalResults(trajectories, metadata.get("eval_config", {}), metadata.get("eval_summary", {}))


def _json_file(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
