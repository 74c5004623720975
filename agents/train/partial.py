"""Partial rollouts (``loop.partial_rollouts``): the async loop's producer without rounds.

The round-based producer plays ``groups_per_step`` groups and adds them to the buffer when the last
episode of the round ends, so the slowest episode holds back every sample of its round, and the
generator runs nearly empty while it finishes. Here episodes stream instead:

- up to ``rollout.max_episodes_in_flight`` episodes run at all times (at least one group's): a new group
  starts as soon as that many minus the episodes running leaves room for all of its episodes and the buffer
  holds fewer than ``loop.max_rollouts_ahead`` batches. Room is counted in episodes, not groups: a group
  waiting for its slowest episode holds one place, not ``group_size``;
- each group goes to the buffer the moment its last episode ends (advantages are group-relative, so a
  group is complete on its own);
- a weight update does not wait for the episodes in flight (the loop hands the load to
  the generator and the trainer goes on): the generator finishes the turns it is running on the old
  weights, drops the sessions' KV caches, and every later turn runs on the new weights, re-prefilling
  its prompt. Each turn records the version that sampled it (``Turn.policy_version``, per token in
  ``TrainSample.token_policy_versions``), and ``buffer.max_policy_age`` bounds staleness per token
  (``buffer.staleness: token``);
- for the logs a "round" is ``groups_per_step`` finished groups; its metrics add
  ``rollout/partial/*``: the share of episodes that spanned an update, the turns that ran after one and
  the prompt tokens those turns prefilled again (the cost of dropping the KV cache).

A checkpoint's ``LoopState.next_task`` is past the groups in flight when it was taken: a resumed run
does not replay them. ``loop.overprovision`` (APRIL-style, optional): start that many extra groups over what fits in flight and,
when a batch's worth of groups has finished, abort the slowest ones still running (dropped, counted in
``rollout/partial/groups_aborted``).
"""

from __future__ import annotations

import asyncio
import time

from agents.groups import GroupRequest, play_one, with_refills
from agents.train.ingest import round_metrics, train_samples, version_metrics
from agents.train.producer import LoopHost
from agents.trajectory import Trajectory


class PartialRollouts:
    """The streaming :class:`~agents.train.producer.Producer` of one loop (see the module docstring)."""

    def __init__(self, loop: LoopHost) -> None:
        self.loop = loop
        cfg = loop.config
        self.group_size = cfg.rollout.group_size
        self.max_episodes = max(cfg.rollout.max_episodes_in_flight, self.group_size)
        self.extra_groups = cfg.loop.overprovision
        self.episodes_running = 0
        self.ahead = cfg.loop.max_rollouts_ahead * cfg.buffer.batch_size * cfg.buffer.dp_size
        self.running: dict[asyncio.Task, float] = {}
        self.finished: list[list[Trajectory]] = []
        self.round_started = time.perf_counter()
        self.aborted = 0

    async def produce(self, stop: asyncio.Event) -> None:
        """Play groups until ``stop`` is set or the loop says RL must stop (``LoopHost.round_finished``)."""
        try:
            while not stop.is_set():
                self._start_groups()
                if not self.running:
                    await asyncio.sleep(0.01)
                    continue
                done, _ = await asyncio.wait(self.running, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del self.running[task]
                    if await self._ingest(task.result()):
                        return
        finally:
            for task in self.running:
                task.cancel()
            await asyncio.gather(*self.running, return_exceptions=True)
            self.running.clear()

    def _start_groups(self) -> None:
        loop = self.loop
        room = self.max_episodes + self.extra_groups * self.group_size
        while self.episodes_running + self.group_size <= room and len(loop.c.buffer) < self.ahead:
            request = loop.round_sampler.next_request(loop.state, loop.state.rounds)
            self.episodes_running += self.group_size
            self.running[asyncio.ensure_future(self._play(request))] = time.perf_counter()

    async def _play(self, request: GroupRequest) -> list[Trajectory]:
        """The group's episodes, concurrently (as ``rollout_group``), an episode lost to the machine refilled
        as ``rollout.lost_episodes`` says; each frees its place when it (and its refills) ended."""
        loop, cfg = self.loop, self.loop.config
        sampling = loop.round_sampling(loop.state.rounds)
        refills = cfg.rollout.lost_episodes_policy().budget()

        def episode(i: int) -> asyncio.Future:
            task = asyncio.ensure_future(with_refills(lambda: play_one(
                loop.c.env_factory, loop.c.generator, loop.c.renderer, sampling=request.episode_sampling(sampling, i),
                seed=request.seed, task=request.task, budget=loop.budget, group_id=request.group_id,
                env_id=cfg.env.id, episode_id=f"{request.group_id}-{i}"), refills))
            task.add_done_callback(self._episode_ended)  # also when cancelled before it started
            return task

        return [t for attempts in await asyncio.gather(*(episode(i) for i in range(request.n))) for t in attempts]

    def _episode_ended(self, _: asyncio.Future) -> None:
        self.episodes_running -= 1

    async def _ingest(self, group: list[Trajectory]) -> bool:
        """One finished group into the buffer; True when RL must stop."""
        loop, cfg, state = self.loop, self.loop.config, self.loop.state
        state.episodes += len(group)
        loop.round_sampler.observe(group, state)
        kept, _ = train_samples(group, cfg)
        if kept and loop.reference is not None:
            await asyncio.to_thread(loop.reference.annotate, kept)
        loop.c.buffer.add(kept)
        loop.samples_added()
        self.finished.append(group)
        if len(self.finished) >= cfg.rollout.groups_per_step:
            self._abort_slowest()
            return self._close_round()
        return False

    def _abort_slowest(self) -> None:
        """Over-provisioning: a batch's worth of groups is in; the ``overprovision`` groups started first
        and still running are the slowest: abort them (their episodes are dropped)."""
        if not self.extra_groups:
            return
        running = [task for task in self.running if not task.done()]  # a done one is ingested next
        oldest = sorted(running, key=self.running.__getitem__)[:self.extra_groups]
        for task in oldest:
            task.cancel()
            del self.running[task]
            self.aborted += 1

    def _close_round(self) -> bool:
        """``groups_per_step`` groups finished: count a round, log its metrics; True when RL must stop."""
        loop, cfg, state = self.loop, self.loop.config, self.loop.state
        trajectories = [t for group in self.finished for t in group]
        self.finished = []
        seconds = time.perf_counter() - self.round_started
        self.round_started = time.perf_counter()
        state.rounds += 1
        # Fresh samples, only for the metrics (the buffer's have their advantages already).
        kept, advantages = train_samples(trajectories, cfg)
        extra = {**version_metrics(trajectories), "rollout/partial/groups_aborted": float(self.aborted),
                 "rollout/partial/groups_in_flight": float(len(self.running))}
        metrics = round_metrics(trajectories, len(kept), advantages, seconds, cfg.eval.success_threshold, extra)
        return loop.round_finished(metrics, seconds)
