"""Which tasks a rollout round plays: task samplers (the curriculum hook) and DAPO's dynamic sampling.

**Task samplers.** Training task ``i`` of a run (its ``i``-th group) is played on the env seed a
``TaskSampler`` chooses; the sampler hears every finished group's rewards. The interface:

- ``choose(task_index) -> int``: the env seed of task ``task_index`` (a run-wide counter, checkpointed as
  ``LoopState.next_task``). It must be deterministic given the sampler's state, so runs reproduce;
- ``observe(seed, rewards, passed)``: a group on ``seed`` finished; ``rewards`` of its trainable episodes
  and, for each, whether it passed (reward >= ``eval.success_threshold``);
- ``state_dict() -> dict`` / ``load_state_dict(dict)``: JSON-serialisable state, kept in checkpoints.

Built in: ``sequential`` (task ``i`` is seed ``env.seed_start + i``: every task is new, the default) and
``pass_rate`` (:class:`PassRateCurriculum`: a fixed pool of seeds, each drawn with a weight from its recent
pass rate ``p``: ``min_weight + p (1 - p)``, so tasks the policy always or never solves, which give a
GRPO group no signal, are drawn rarely and tasks it solves half the time most; unseen tasks count as
``p = 0.5``). ``rollout.curriculum.sampler: "package.module:factory"`` plugs in another; the factory is
called as ``factory(seed_start=..., seed=..., **rollout.curriculum.kwargs)``.

**Dynamic sampling** (DAPO, ``rollout.dynamic_sampling.enabled``). A group whose episodes all earned the
same reward has advantage 0 everywhere and is dropped (``advantages.drop_zero_variance``). Without
dynamic sampling a round plays ``rollout.groups_per_step`` groups and keeps what it keeps; with it, the
round plays more groups until ``groups_per_step`` groups with varying rewards are in, at most
``max_rounds x groups_per_step`` groups in all (the bound: ``max_rounds=1`` is no extra sampling). Each
extra pass plays the missing number of groups divided by the keep rate seen so far (within what the bound
leaves). Metrics per round: ``rollout/dynamic/groups_played``, ``groups_dropped`` (no reward variance),
``groups_kept``, ``passes`` and ``target_met``.
"""

from __future__ import annotations

import importlib
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agents.groups import GroupRequest, lost_for_good
from agents.trajectory import Trajectory
from forge_env.rl.advantages import is_zero_variance


@runtime_checkable
class TaskSampler(Protocol):
    """Chooses the env seed of each training task and hears how each group went (module docstring)."""

    def choose(self, task_index: int) -> int: ...

    def observe(self, seed: int, rewards: Sequence[float], passed: Sequence[bool]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SequentialTasks:
    """Task ``i`` is seed ``seed_start + i``: every task new, no curriculum (the default)."""

    def __init__(self, seed_start: int = 0, seed: int = 0) -> None:
        self.seed_start = seed_start

    def choose(self, task_index: int) -> int:
        return self.seed_start + task_index

    def observe(self, seed: int, rewards: Sequence[float], passed: Sequence[bool]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class PassRateCurriculum:
    """Draws seeds from ``[seed_start, seed_start + pool_size)`` weighted by their recent pass rate.

    A seed's pass rate ``p`` is over its last ``window`` trainable episodes (unseen: 0.5); its weight is
    ``min_weight + p (1 - p)``. The draw for task ``i`` uses a generator seeded with ``(seed, i)``, so it
    depends only on the run's seed, ``i`` and the history observed so far.
    """

    def __init__(self, seed_start: int = 0, seed: int = 0, *, pool_size: int = 256, window: int = 16,
                 min_weight: float = 0.02) -> None:
        if pool_size < 1 or window < 1:
            raise ValueError(f"pass_rate curriculum: pool_size ({pool_size}) and window ({window}) must be >= 1")
        if not min_weight > 0:
            raise ValueError(f"pass_rate curriculum: min_weight must be > 0 (else a task can starve), got {min_weight}")
        self.seed_start, self.seed = seed_start, seed
        self.pool_size, self.window, self.min_weight = pool_size, window, min_weight
        self.history: dict[int, deque[bool]] = {}

    def pass_rate(self, seed: int) -> float | None:
        """The seed's recent pass rate, or None if it was never played."""
        seen = self.history.get(seed)
        return sum(seen) / len(seen) if seen else None

    def weight(self, seed: int) -> float:
        p = self.pass_rate(seed)
        p = 0.5 if p is None else p
        return self.min_weight + p * (1.0 - p)

    def choose(self, task_index: int) -> int:
        pool = range(self.seed_start, self.seed_start + self.pool_size)
        rng = random.Random(f"pass_rate:{self.seed}:{task_index}")
        return rng.choices(pool, weights=[self.weight(s) for s in pool])[0]

    def observe(self, seed: int, rewards: Sequence[float], passed: Sequence[bool]) -> None:
        self.history.setdefault(seed, deque(maxlen=self.window)).extend(bool(p) for p in passed)

    def state_dict(self) -> dict[str, Any]:
        return {"history": {str(s): list(h) for s, h in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {int(s): deque((bool(p) for p in h), maxlen=self.window)
                        for s, h in state.get("history", {}).items()}


BUILTIN_SAMPLERS: dict[str, Callable[..., TaskSampler]] = {
    "sequential": SequentialTasks,
    "pass_rate": PassRateCurriculum,
}


def build_task_sampler(name: str, kwargs: dict[str, Any], *, seed_start: int, seed: int) -> TaskSampler:
    """A built-in sampler by name, or ``package.module:factory``; ``ValueError``/``TypeError`` on a bad one."""
    if name in BUILTIN_SAMPLERS:
        factory = BUILTIN_SAMPLERS[name]
    elif ":" in name:
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"task sampler {name!r} cannot be imported: {exc}") from None
    else:
        raise ValueError(f"unknown task sampler {name!r}; choose one of {sorted(BUILTIN_SAMPLERS)} "
                         "or give 'package.module:factory'")
    sampler = factory(seed_start=seed_start, seed=seed, **kwargs)
    missing = [m for m in ("choose", "observe", "state_dict", "load_state_dict") if not callable(getattr(sampler, m, None))]
    if missing:
        raise TypeError(f"task sampler {name!r} lacks {missing} (see agents.train.sampling.TaskSampler)")
    return sampler


@dataclass
class PlayedRound:
    """What :meth:`RoundSampler.play` played: every episode, the next task index, and the metrics."""

    trajectories: list[Trajectory]
    next_task: int
    metrics: dict[str, float] = field(default_factory=dict)


PlayFn = Callable[[list[GroupRequest]], AsyncIterator[list[Trajectory]]]


class RoundSampler:
    """Plans the groups of each round for the loop: the task sampler's seeds, then dynamic sampling's passes."""

    def __init__(self, tasks: TaskSampler, *, groups_per_step: int, group_size: int, success_threshold: float,
                 dynamic: bool = False, max_rounds: int = 1) -> None:
        if max_rounds < 1:
            raise ValueError(f"dynamic_sampling.max_rounds must be >= 1, got {max_rounds}")
        self.tasks = tasks
        self.groups_per_step, self.group_size = groups_per_step, group_size
        self.success_threshold = success_threshold
        self.dynamic, self.max_rounds = dynamic, max_rounds
        self._loaded = False

    @classmethod
    def from_config(cls, config: Any) -> RoundSampler:
        """The sampler of a ``GRPOConfig``."""
        r = config.rollout
        tasks = build_task_sampler(r.curriculum.sampler, r.curriculum.kwargs, seed_start=config.env.seed_start,
                                   seed=config.loop.seed)
        return cls(tasks, groups_per_step=r.groups_per_step, group_size=r.group_size,
                   success_threshold=config.eval.success_threshold, dynamic=r.dynamic_sampling.enabled,
                   max_rounds=r.dynamic_sampling.max_rounds)

    def trainable(self, group: list[Trajectory]) -> bool:
        """Whether ``group`` gives training signal: no episode lost for good (``agents.groups.lost_for_good``:
        the group is dropped whole), at least two trainable episodes, rewards not all equal."""
        if any(lost_for_good(t) for t in group):
            return False
        return not is_zero_variance([t.reward for t in group if t.ok and t.num_sampled_tokens > 0])

    async def play(self, state: Any, play: PlayFn) -> PlayedRound:
        """Play round ``state.rounds`` from task ``state.next_task`` on (``play(requests)`` streams the finished
        groups); moves ``state.next_task`` past the tasks played and keeps the task sampler's state in
        ``state.tasks`` (a ``LoopState``, so a checkpoint holds it)."""
        self._load(state)
        round_index, first_task = state.rounds, state.next_task
        budget = self.groups_per_step * (self.max_rounds if self.dynamic else 1)
        trajectories: list[Trajectory] = []
        task, kept, played, passes = first_task, 0, 0, 0
        want = self.groups_per_step
        while want > 0:
            requests = []
            for _ in range(want):
                requests.append(GroupRequest(seed=self.tasks.choose(task), n=self.group_size,
                                             group_id=f"r{round_index}-t{task}"))
                task += 1
            passes += 1
            async for group in play(requests):
                trajectories.extend(group)
                played += 1
                kept += self.trainable(group)
                self.observe(group)
            missing = self.groups_per_step - kept
            if not self.dynamic or missing <= 0 or played >= budget:
                break
            keep_rate = max(kept / played, 1.0 / self.groups_per_step)
            want = min(budget - played, math.ceil(missing / keep_rate))
        metrics = {
            "rollout/dynamic/groups_played": float(played),
            "rollout/dynamic/groups_kept": float(kept),
            "rollout/dynamic/groups_dropped": float(played - kept),
            "rollout/dynamic/passes": float(passes),
            "rollout/dynamic/target_met": float(kept >= self.groups_per_step),
        }
        state.next_task = task
        state.tasks = self.tasks.state_dict()
        return PlayedRound(trajectories, task, metrics)

    def next_request(self, state: Any, round_index: int) -> GroupRequest:
        """The next group to play on its own (partial rollouts stream groups instead of playing rounds):
        task ``state.next_task``, which it moves past."""
        self._load(state)
        task = state.next_task
        state.next_task = task + 1
        return GroupRequest(seed=self.tasks.choose(task), n=self.group_size, group_id=f"r{round_index}-t{task}")

    def _load(self, state: Any) -> None:
        if not self._loaded:  # a resumed run's history; a fresh run's is empty
            self.tasks.load_state_dict(state.tasks)
            self._loaded = True

    def observe(self, group: list[Trajectory], state: Any = None) -> None:
        """Tell the task sampler how ``group`` went (and keep its state in ``state.tasks`` when given)."""
        self._observe(group)
        if state is not None:
            state.tasks = self.tasks.state_dict()

    def _observe(self, group: list[Trajectory]) -> None:
        done = [t for t in group if t.ok and t.num_sampled_tokens > 0]
        if done and done[0].seed is not None:
            self.tasks.observe(done[0].seed, [t.reward for t in done],
                               [t.reward >= self.success_threshold for t in done])
