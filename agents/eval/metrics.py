"""Scores of an evaluation run: mean reward, unbiased pass@k, rubric metrics, usage; tables for the terminal.

An episode *passes* when it finished without an error and its reward is at least ``pass_threshold``.
Episodes that ended in an endpoint error never count as failures: they are left out of every score and
counted under ``errors`` (the model was never asked).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from agents.trajectory import ERROR_ENDPOINT, LEVEL_MESSAGE, Trajectory
from forge_env.chat_tools import is_tool_result


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``n`` samples of which ``c`` passed (Chen et al., 2021):
    ``1 - C(n-c, k) / C(n, k)``, the chance that ``k`` samples drawn without replacement include a pass."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def reported_ks(samples: int) -> list[int]:
    """The k of pass@k shown for ``samples`` samples per task: 1, powers of two, and ``samples`` itself."""
    ks = {1, samples}
    k = 2
    while k < samples:
        ks.add(k)
        k *= 2
    return sorted(ks)


def task_key(trajectory: Trajectory) -> str:
    """Which task an episode played: its group id (one group per task seed)."""
    return trajectory.group_id or str(trajectory.seed)


def tool_calls(trajectory: Trajectory) -> int:
    """Tool calls the env answered in the episode (one ``tool`` message each, or the user message a template
    without a ``tool`` role got instead: ``forge_env.chat_tools.is_tool_result``)."""
    return sum(1 for message in trajectory.messages if is_tool_result(message))


def completion_tokens(trajectory: Trajectory) -> int:
    if trajectory.level == LEVEL_MESSAGE:
        return int(trajectory.usage.get("completion_tokens", 0))
    return trajectory.num_sampled_tokens


def total_tokens(trajectory: Trajectory) -> int:
    """The episode's whole token list; for chat APIs, the prompt + completion tokens of all its requests (billed)."""
    if trajectory.level == LEVEL_MESSAGE:
        return int(trajectory.usage.get("prompt_tokens", 0)) + int(trajectory.usage.get("completion_tokens", 0))
    return len(trajectory.token_ids)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(trajectories: Sequence[Trajectory], *, samples: int, pass_threshold: float = 1.0,
              wall_s: float | None = None) -> dict[str, Any]:
    """The ``summary.json`` scores of a run's episodes (see the module docstring for what counts)."""
    ok = [t for t in trajectories if t.ok]
    endpoint_errors = [t for t in trajectories if not t.ok and t.error_kind == ERROR_ENDPOINT]
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in ok:
        by_task[task_key(trajectory)].append(trajectory)
    pass_k: dict[str, float | None] = {}
    for k in reported_ks(samples):
        # Tasks that lost samples to errors still count for every k their remaining samples allow.
        per_task = [pass_at_k(len(group), sum(t.reward >= pass_threshold for t in group), k)
                    for group in by_task.values() if len(group) >= k]
        pass_k[f"pass@{k}"] = _mean(per_task)
    metric_names = sorted({name for t in ok for name in t.metrics})
    rubric = {name: _mean([float(t.metrics[name]) for t in ok if name in t.metrics]) for name in metric_names}
    summary: dict[str, Any] = {
        "episodes": len(trajectories),
        "ok": len(ok),
        "errors": len(trajectories) - len(ok),
        "endpoint_errors": len(endpoint_errors),
        "internal_errors": len(trajectories) - len(ok) - len(endpoint_errors),
        "endpoint_retries": sum(t.endpoint_retries for t in trajectories),
        "tasks": len({task_key(t) for t in trajectories}),
        "mean_reward": _mean([t.reward for t in ok]),
        **pass_k,
        "metrics": rubric,
        "mean_turns": _mean([len(t.turns) for t in ok]),
        "mean_tool_calls": _mean([tool_calls(t) for t in ok]),
        "truncated": sum(t.truncated for t in ok),
        "mean_completion_tokens": _mean([completion_tokens(t) for t in ok]),
        "mean_total_tokens": _mean([total_tokens(t) for t in ok]),
        "mean_episode_s": _mean([t.total_s for t in ok]),
    }
    if wall_s is not None:
        summary["wall_s"] = wall_s
        summary["episodes_per_s"] = len(trajectories) / wall_s if wall_s > 0 else None
    return summary


def _rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    rows = [(key, summary.get(key)) for key in ("mean_reward",)]
    rows += [(key, value) for key, value in summary.items() if key.startswith("pass@")]
    rows += [(f"metric/{name}", value) for name, value in summary.get("metrics", {}).items()]
    rows += [(key, summary.get(key)) for key in (
        "mean_turns", "mean_tool_calls", "truncated", "mean_completion_tokens", "mean_total_tokens", "episodes",
        "ok", "errors", "endpoint_errors", "internal_errors", "endpoint_retries", "mean_episode_s", "wall_s",
        "episodes_per_s") if key in summary]
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(summary: dict[str, Any], title: str = "") -> str:
    """The run's scores as an aligned two-column table."""
    rows = _rows(summary)
    width = max(len(name) for name, _ in rows)
    lines = [title] if title else []
    lines += [f"{name:<{width}}  {_cell(value):>10}" for name, value in rows]
    return "\n".join(lines)


def format_compare(a: dict[str, Any], b: dict[str, Any], label_a: str, label_b: str) -> str:
    """Two runs' scores side by side, with the difference (b - a) where both are numbers."""
    rows_a, rows_b = dict(_rows(a)), dict(_rows(b))
    names = list(rows_a) + [name for name in rows_b if name not in rows_a]
    width = max(len(name) for name in names)
    col = max(10, len(label_a), len(label_b))
    lines = [f"{'':<{width}}  {label_a:>{col}}  {label_b:>{col}}  {'delta':>10}"]
    for name in names:
        va, vb = rows_a.get(name), rows_b.get(name)
        numeric = isinstance(va, int | float) and isinstance(vb, int | float)
        delta = _cell(vb - va) if numeric else ""
        lines.append(f"{name:<{width}}  {_cell(va):>{col}}  {_cell(vb):>{col}}  {delta:>10}")
    return "\n".join(lines)
