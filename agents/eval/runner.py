"""Plan and play the episodes of an evaluation run, appending each finished one to ``episodes.jsonl``.

The plan depends only on the seed, the number of tasks and the samples per task: task ``k`` resets the env
with seed ``seed + k`` and its ``j``-th sample is episode ``task{seed+k}-s{j}``, sampled with its own seed.
So two models evaluated with the same flags play the same tasks, and a resumed run knows which episodes it
still owes. Episodes are appended as they finish (an interrupted run keeps them).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from agents.trajectory import ERROR_ENDPOINT, Trajectory, read_jsonl

EPISODES_FILE = "episodes.jsonl"


@dataclass(frozen=True)
class PlannedEpisode:
    """One episode of the plan: which task (env seed) and which sample of it."""

    episode_id: str
    group_id: str
    env_seed: int
    sample: int
    sampling_seed: int


def plan_episodes(seed: int, n_tasks: int, samples: int) -> list[PlannedEpisode]:
    """``n_tasks * samples`` episodes; task ``k`` uses env seed ``seed + k`` (see the module docstring)."""
    if n_tasks < 1 or samples < 1:
        raise ValueError(f"--n-tasks ({n_tasks}) and --samples ({samples}) must be >= 1")
    plan = []
    for k in range(n_tasks):
        group_id = f"task{seed + k}"
        for j in range(samples):
            # Distinct sampling seeds per (task, sample) that do not shift when n_tasks or samples grows.
            plan.append(PlannedEpisode(f"{group_id}-s{j}", group_id, seed + k, j, (seed + k) * 100_003 + j))
    return plan


def load_finished(path: Path, plan: Sequence[PlannedEpisode]) -> list[Trajectory]:
    """The planned episodes already in ``path`` that need no re-run (endpoint errors are played again).

    Rewrites the file to hold exactly those, so the episodes appended next are not duplicated.
    """
    if not path.exists():
        return []
    wanted = {p.episode_id for p in plan}
    kept: dict[str, Trajectory] = {}
    for trajectory in read_jsonl(str(path)):
        if trajectory.episode_id in wanted and not (not trajectory.ok and trajectory.error_kind == ERROR_ENDPOINT):
            kept[trajectory.episode_id] = trajectory
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for trajectory in kept.values():
            out.write(trajectory.to_json() + "\n")
    os.replace(tmp, path)
    return list(kept.values())


class ProgressBar:
    """A one-line progress bar on stderr (a fresh line every ``every_s`` seconds when stderr is not a tty)."""

    def __init__(self, total: int, done: int = 0, label: str = "eval", stream: TextIO | None = None,
                 every_s: float = 10.0) -> None:
        self.total, self.done, self.label = total, done, label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = every_s
        self.started = self.last = time.perf_counter()
        self.new = 0
        self.reward_sum = 0.0
        self.ok = 0
        self.errors = 0

    def update(self, trajectory: Trajectory) -> None:
        self.done += 1
        self.new += 1
        if trajectory.ok:
            self.ok += 1
            self.reward_sum += trajectory.reward
        else:
            self.errors += 1
        now = time.perf_counter()
        if self.tty or now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            self._draw(final=self.done == self.total)

    def line(self) -> str:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        rate = self.new / max(time.perf_counter() - self.started, 1e-9)
        reward = f"{self.reward_sum / self.ok:.3f}" if self.ok else "-"
        return (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{rate:.2f} ep/s  reward {reward}  errors {self.errors}")

    def _draw(self, final: bool) -> None:
        end = "\n" if final or not self.tty else ""
        prefix = "\r" if self.tty else ""
        print(prefix + self.line(), end=end, file=self.stream, flush=True)


async def play_plan(plan: Sequence[PlannedEpisode], play: Callable[[PlannedEpisode], Awaitable[Trajectory]],
                    out_path: Path, *, concurrency: int, progress: ProgressBar | None = None) -> list[Trajectory]:
    """Play ``plan`` with at most ``concurrency`` episodes in flight, appending each to ``out_path``."""
    limit = asyncio.Semaphore(max(concurrency, 1))
    finished: list[Trajectory] = []
    with open(out_path, "a", encoding="utf-8") as out:
        async def one(planned: PlannedEpisode) -> None:
            async with limit:
                trajectory = await play(planned)
            out.write(trajectory.to_json() + "\n")
            out.flush()
            finished.append(trajectory)
            if progress is not None:
                progress.update(trajectory)

        async with asyncio.TaskGroup() as group:  # one crash cancels the rest before the file closes
            for planned in plan:
                group.create_task(one(planned))
    return finished


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
