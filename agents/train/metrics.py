"""Where training metrics go: a JSONL file always, TensorBoard and wandb when installed and asked for.

Each record is ``{"step": N, "kind": "train" | "eval" | ..., **values}``; the JSONL file is what the
final plot and any later analysis read, so it is written (and flushed) first.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsLogger:
    """Append metric records to ``<output_dir>/metrics.jsonl`` and mirror them to TensorBoard / wandb."""

    def __init__(self, output_dir: str | Path, *, tensorboard: bool = True, wandb: bool = False,
                 wandb_project: str = "forge-env", config: dict[str, Any] | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.output_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = self._open_tensorboard() if tensorboard else None
        self._wandb = self._open_wandb(wandb_project, config) if wandb else None

    def _open_tensorboard(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional; the JSONL file has everything
            log.warning("tensorboard is not installed; metrics go to %s only", self.path)
            return None
        return SummaryWriter(str(self.output_dir / "tensorboard"))

    def _open_wandb(self, project: str, config: dict[str, Any] | None) -> Any:
        try:
            import wandb
        except ImportError:
            log.warning("logging.wandb=true but wandb is not installed (pip install wandb); skipping it")
            return None
        return wandb.init(project=project, config=config or {}, dir=str(self.output_dir))

    def log(self, step: int, kind: str, values: dict[str, Any]) -> dict[str, Any]:
        """Write one record; non-finite and non-numeric values stay in the JSONL file only."""
        record = {"step": step, "kind": kind, "time": round(time.time(), 3), **values}
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()
        scalars = {f"{kind}/{k}": float(v) for k, v in values.items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
