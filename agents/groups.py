"""Group rollouts for GRPO, and a driver that keeps many episodes in flight.

``rollout_group`` plays ``n`` episodes of one task (same env seed, different sampling
seeds). ``stream_groups`` keeps up to ``max_episodes_in_flight`` episodes running across
many tasks and yields each group as soon as all its episodes finish, printing progress
(episodes/s, mean reward) on long runs.

**Lost episodes** (:class:`LostEpisodes`, ``rollout.lost_episodes`` in training). An episode the machine
spoiled (``status="infra_error"``: a lost replica, a broken sandbox) says nothing about the policy, and
normalising its group over the survivors would bias the advantages towards tasks that do not fail. With
``refill`` the episode is played again from scratch (same task, same sampling seed, so the group is the
one an uninterrupted run would have played) up to ``max_refills`` times per group; the failed attempt
stays in the group, renamed ``<episode_id>/lost<k>`` and marked with ``metrics[REFILLED]`` (its attempt
number), so it shows in the trajectory table and the metrics. A lost episode that was not refilled
(``drop``, or the group's refills spent) makes its whole group untrainable (:func:`lost_for_good`;
``agents.train.ingest`` drops it and counts it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from agents.rollout import EpisodeBudget, Renderer, episode_status, run_episode
from agents.trajectory import STATUS_INFRA_ERROR, Trajectory
from forge_env.core.remote import AsyncEnv
from forge_env.generation.base import Generator, SamplingParams

EnvFactory = Callable[[], AsyncEnv | Awaitable[AsyncEnv]]

#: ``Trajectory.metrics`` key of an attempt lost to the machine and replaced by a refill: its attempt number (1, 2, ...).
REFILLED = "lost_attempt_refilled"


@dataclass(frozen=True)
class LostEpisodes:
    """What a group does with an episode lost to the machine (see the module docstring): ``refill`` it (at
    most ``max_refills`` times per group, then the group is dropped) or ``drop`` the group whole."""

    policy: Literal["refill", "drop"] = "refill"
    max_refills: int = 2

    def __post_init__(self) -> None:
        if self.policy not in ("refill", "drop"):
            raise ValueError(f"lost_episodes: {self.policy!r} is not one of ['refill', 'drop']")
        if self.max_refills < 0:
            raise ValueError(f"max_refills must be >= 0, got {self.max_refills}")

    def budget(self) -> RefillBudget:
        """The refills one group may spend."""
        return RefillBudget(self.max_refills if self.policy == "refill" else 0)


class RefillBudget:
    """The refills left to one group (shared by its episodes, which run concurrently)."""

    def __init__(self, left: int = 0) -> None:
        self.left = left

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def lost_for_good(trajectory: Trajectory) -> bool:
    """Whether ``trajectory`` is an episode the machine spoiled that no refill replaced: its group must not train."""
    return trajectory.status == STATUS_INFRA_ERROR and REFILLED not in trajectory.metrics


def trainable_groups(trajectories: Iterable[Trajectory]) -> tuple[list[Trajectory], set[str]]:
    """The trajectories of the groups that may train (no member lost for good), and the ids of those that may not."""
    trajectories = list(trajectories)
    dropped = {t.group_id for t in trajectories if lost_for_good(t)}
    return [t for t in trajectories if t.group_id not in dropped], dropped


async def with_refills(start: Callable[[], Awaitable[Trajectory]], budget: RefillBudget | None) -> list[Trajectory]:
    """Play one episode (``start()``); while it is lost to the machine and ``budget`` allows, play it again
    from scratch. Returns the failed attempts (renamed, marked :data:`REFILLED`) and then the last attempt."""
    attempts: list[Trajectory] = []
    while True:
        trajectory = await start()
        if trajectory.status != STATUS_INFRA_ERROR or budget is None or not budget.take():
            return [*attempts, trajectory]
        attempts.append(trajectory)
        trajectory.metrics[REFILLED] = float(len(attempts))
        trajectory.episode_id = f"{trajectory.episode_id}/lost{len(attempts)}"


@dataclass
class GroupRequest:
    """One GRPO group to play: ``n`` episodes of the env seeded with ``seed`` (or of the exact ``task``)."""

    seed: int | None = None
    task: dict[str, Any] | None = None
    n: int = 8
    group_id: str = ""
    sampling_seed: int | None = None
    """The group's base sampling seed (default: the sampling params' own seed)."""

    def episode_sampling(self, sampling: SamplingParams, index: int) -> SamplingParams:
        """The sampling params of this group's episode ``index``: a seed of its own, derived from the base
        seed, this group's identity and ``index``, so no two episodes of a round share a random stream
        (the rollout then derives one per turn)."""
        if self.sampling_seed is not None:
            sampling = dataclasses.replace(sampling, seed=self.sampling_seed)
        if sampling.seed is None:
            return dataclasses.replace(sampling, n=1)
        return sampling.derived("group", self.identity(), "episode", index).for_sample(0)

    def identity(self) -> str:
        """What tells this group apart from the others of a round, reproducibly: its id, else its env seed or task."""
        if self.group_id:
            return self.group_id
        if self.seed is not None:
            return f"seed:{self.seed}"
        return "task:" + json.dumps(self.task, sort_keys=True, default=str)


async def make_env(env_factory: EnvFactory) -> AsyncEnv:
    """Call ``env_factory`` (sync or async) for a fresh environment."""
    env = env_factory()
    return await env if inspect.isawaitable(env) else env


async def close_env(env: AsyncEnv) -> None:
    """Close ``env`` if it can be closed (best-effort: a finished episode's env may already be gone)."""
    close = getattr(env, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # closing a finished episode's env is best-effort
            pass


async def play_one(env_factory: EnvFactory, generator: Generator, renderer: Renderer, *, sampling: SamplingParams,
                   seed: int | None, task: dict[str, Any] | None, budget: EpisodeBudget | None,
                   group_id: str, env_id: str, episode_id: str) -> Trajectory:
    """Build an env, play one episode, close the env. Errors building the env become an error trajectory too."""
    try:
        env = await make_env(env_factory)
    except Exception as exc:
        return Trajectory(episode_id=episode_id, env_id=env_id, group_id=group_id, seed=seed, task=task or {},
                          status=episode_status(exc), error=f"could not create the environment: {type(exc).__name__}: {exc}")
    try:
        return await run_episode(env, generator, renderer, sampling=sampling, seed=seed, task=task, budget=budget,
                                 episode_id=episode_id, group_id=group_id, env_id=env_id)
    finally:
        await close_env(env)


async def rollout_group(env_factory: EnvFactory, generator: Generator, renderer: Renderer, request: GroupRequest, *,
                        sampling: SamplingParams | None = None, budget: EpisodeBudget | None = None,
                        env_id: str = "") -> list[Trajectory]:
    """Play ``request.n`` episodes of one task concurrently, each with its own derived sampling seed
    (see :meth:`GroupRequest.episode_sampling`)."""
    sampling = sampling or SamplingParams()
    group_id = request.group_id or uuid.uuid4().hex[:8]
    return list(await asyncio.gather(*(
        play_one(env_factory, generator, renderer, sampling=request.episode_sampling(sampling, i),
                 seed=request.seed, task=request.task, budget=budget, group_id=group_id, env_id=env_id,
                 episode_id=f"{group_id}-{i}")
        for i in range(request.n))))


class Progress:
    """Prints episodes/s and mean reward every ``every_s`` seconds (to stderr) on long runs."""

    def __init__(self, every_s: float = 10.0, label: str = "rollouts", stream: Any = None):
        self.every_s = every_s
        self.label = label
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()
        self.last = self.started
        self.episodes = 0
        self.reward_sum = 0.0
        self.errors = 0
        self.drifted = 0

    def update(self, trajectories: Iterable[Trajectory]) -> None:
        for trajectory in trajectories:
            self.episodes += 1
            self.reward_sum += trajectory.reward
            self.errors += not trajectory.ok
            self.drifted += trajectory.drifted
        now = time.perf_counter()
        if self.every_s and now - self.last >= self.every_s:
            self.last = now
            print(self.summary(), file=self.stream, flush=True)

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / max(time.perf_counter() - self.started, 1e-9)

    def summary(self) -> str:
        mean = self.reward_sum / max(self.episodes, 1)
        return (f"[{self.label}] {self.episodes} episodes, {self.episodes_per_s:.2f} ep/s, "
                f"mean reward {mean:.3f}, errors {self.errors}"
                + (f", template drift in {self.drifted} (see trajectory.drift)" if self.drifted else ""))


async def stream_groups(requests: Iterable[GroupRequest], env_factory: EnvFactory, generator: Generator,
                        renderer: Renderer, *, sampling: SamplingParams | None = None,
                        budget: EpisodeBudget | None = None, max_episodes_in_flight: int = 64, env_id: str = "",
                        progress: Progress | None = None,
                        lost_episodes: LostEpisodes | None = None) -> AsyncIterator[list[Trajectory]]:
    """Yield finished groups as they complete, keeping at most ``max_episodes_in_flight`` episodes running.

    ``lost_episodes``: refill episodes lost to the machine (module docstring); a refilled group holds its
    failed attempts too. None: no refills (an evaluation's episode lost to the machine counts as a failure)."""
    sampling = sampling or SamplingParams()
    limit = asyncio.Semaphore(max_episodes_in_flight)

    async def limited(coro_factory: Callable[[], Awaitable[Trajectory]]) -> Trajectory:
        async with limit:
            return await coro_factory()

    async def group(request: GroupRequest) -> list[Trajectory]:
        group_id = request.group_id or uuid.uuid4().hex[:8]
        refills = lost_episodes.budget() if lost_episodes is not None else None
        episodes = []
        for i in range(request.n):
            episode_sampling = request.episode_sampling(sampling, i)

            def start(i: int = i, s: SamplingParams = episode_sampling) -> Awaitable[Trajectory]:
                return play_one(env_factory, generator, renderer, sampling=s, seed=request.seed, task=request.task,
                                budget=budget, group_id=group_id, env_id=env_id, episode_id=f"{group_id}-{i}")

            episodes.append(with_refills(lambda start=start: limited(start), refills))
        return [t for attempts in await asyncio.gather(*episodes) for t in attempts]

    pending: dict[asyncio.Task, int] = {}
    request_iter = iter(requests)
    exhausted = False
    try:
        while True:
            # Queue groups until their episodes can fill the in-flight limit; the semaphore does the rest.
            while not exhausted and sum(pending.values()) < max_episodes_in_flight:
                request = next(request_iter, None)
                if request is None:
                    exhausted = True
                    break
                pending[asyncio.ensure_future(group(request))] = request.n
            if not pending:
                return
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                del pending[finished]
                trajectories = finished.result()
                if progress is not None:
                    progress.update(trajectories)
                yield trajectories
    finally:
        for task in pending:
            task.cancel()
