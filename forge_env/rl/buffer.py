"""Replay buffer between rollouts and the trainer.

Rollout loops ``add`` finished samples; the trainer asks ``sample(curr_policy_version)``
for a batch and gets ``None`` when the buffer cannot fill one yet. Samples leave the
buffer when they become too stale (``max_policy_age``: an episode's age is that of its
oldest turn; with ``staleness="token"`` each turn's tokens age on their own, see below), when the buffer is over ``max_size`` (oldest first) or after they have been
sampled more than ``max_resample_count`` times (0: each sample is trained on once).

``staleness="token"`` (for partial rollouts, where one episode's turns come from several policy
versions): the turns older than ``max_policy_age`` are masked out of the sample (``loss_mask`` and
``old_logprobs`` 0 on their tokens; counted in ``stale_tokens_masked`` / ``stale_turns_masked``) and the
rest of the episode still trains; a sample left without a fresh sampled token is dropped
(``evicted_policy_age``).

With ``keep_groups`` a batch is made of whole GRPO groups (never part of one), and each
data-parallel shard gets whole groups. The buffer is plain in-process Python; the Monarch
actor wrapper lives in ``forge_env.rl.buffer_actor``.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from forge_env.rl.types import MessageLevelTrajectoryError, TrainSample


@dataclass
class ReplayBufferConfig:
    """Sizes and eviction rules of a ``ReplayBuffer``."""

    batch_size: int = 8
    """Samples per data-parallel shard; a full batch has ``batch_size * dp_size`` samples."""
    max_policy_age: int | None = None
    """Evict samples older than this many policy versions (None: never)."""
    staleness: str | None = None
    """How ``max_policy_age`` applies: ``episode`` (a sample is as old as its oldest turn and leaves whole)
    or ``token`` (each turn's tokens by the version that sampled them: stale turns are masked out).
    None: ``episode`` (the GRPO app's loop makes it ``token`` under ``loop.partial_rollouts``)."""
    max_size: int | None = None
    """Keep at most this many samples, dropping the oldest (None: unbounded)."""
    max_resample_count: int | None = 0
    """Evict a sample once it has been sampled more than this many times (None: never)."""
    keep_groups: bool = False
    """Sample whole groups (same ``group_id``) only; a shard is filled exactly or not at all. ``sample``
    returns ``None`` exactly when no choice of whole groups fills every shard (an exact search over
    group sizes, not first-fit); groups larger than ``batch_size`` are never sampled."""
    dp_size: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.dp_size < 1:
            raise ValueError(f"batch_size ({self.batch_size}) and dp_size ({self.dp_size}) must be >= 1")
        if self.max_policy_age is not None and self.max_policy_age < 0:
            raise ValueError("max_policy_age must be >= 0 (or None for no limit)")
        if self.staleness not in (None, "episode", "token"):
            raise ValueError(f"staleness must be 'episode' or 'token', got {self.staleness!r}")
        if self.max_size is not None and self.max_size < self.batch_size * self.dp_size:
            raise ValueError(
                f"max_size ({self.max_size}) is smaller than one batch ({self.batch_size} x {self.dp_size}); "
                "the buffer could never fill a batch"
            )
        if self.max_resample_count is not None and self.max_resample_count < 0:
            raise ValueError("max_resample_count must be >= 0 (or None for unlimited reuse)")


@dataclass
class _Entry:
    sample: TrainSample
    times_sampled: int = 0


class ReplayBuffer:
    """In-process replay buffer of ``TrainSample``s (see the module docstring for the rules)."""

    def __init__(self, config: ReplayBufferConfig | None = None, **overrides: Any) -> None:
        config = ReplayBufferConfig(**overrides) if config is None else dataclasses.replace(config, **overrides)
        self.config = config
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self._rng = random.Random(config.seed)
        self._last_version = 0
        self._counters: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, samples: TrainSample | Iterable[TrainSample]) -> int:
        """Add samples (one or many); returns the buffer size after eviction by ``max_size``."""
        if isinstance(samples, TrainSample) or hasattr(samples, "level"):  # one sample, or one trajectory
            samples = [samples]
        for sample in samples:
            if getattr(sample, "level", None) == "message" or (
                    isinstance(sample, TrainSample) and sample.metadata.get("level") == "message"):
                raise MessageLevelTrajectoryError(
                    "ReplayBuffer.add refuses message-level episodes (played through a chat API): they have no "
                    "token ids, loss mask or sampler logprobs to train on; collect training data with a "
                    "token-level generator")
            if not isinstance(sample, TrainSample):
                raise TypeError(f"ReplayBuffer.add takes TrainSample objects, got {type(sample).__name__}")
            self._entries[self._next_key] = _Entry(sample)
            self._next_key += 1
            self._counters["added"] += 1
        max_size = self.config.max_size
        while max_size is not None and len(self._entries) > max_size:
            self._entries.popitem(last=False)
            self._counters["evicted_max_size"] += 1
        return len(self._entries)

    def evict(self, curr_policy_version: int) -> int:
        """Drop samples older than ``max_policy_age`` at ``curr_policy_version``; returns how many."""
        self._last_version = max(self._last_version, curr_policy_version)
        max_age = self.config.max_policy_age
        if max_age is None:
            return 0
        if self.config.staleness == "token":
            return self._evict_stale_tokens(curr_policy_version - max_age)
        stale = [
            key
            for key, entry in self._entries.items()
            if curr_policy_version - entry.sample.min_policy_version > max_age
        ]
        for key in stale:
            del self._entries[key]
        self._counters["evicted_policy_age"] += len(stale)
        return len(stale)

    def _evict_stale_tokens(self, oldest: int) -> int:
        """Mask the turns sampled before version ``oldest``; drop samples with no fresh turn left."""
        dropped = 0
        for key, entry in list(self._entries.items()):
            sample = entry.sample
            if sample.min_policy_version >= oldest:
                continue
            fresh = [i for i, v in enumerate(sample.policy_versions) if v >= oldest]
            if not fresh or not sample.turn_spans:
                del self._entries[key]
                dropped += 1
                continue
            mask, logprobs = list(sample.loss_mask), list(sample.old_logprobs)
            masked = 0
            for i, (start, end) in enumerate(sample.turn_spans):
                if i not in fresh:
                    masked += sum(mask[start:end])
                    mask[start:end] = [0] * (end - start)
                    logprobs[start:end] = [0.0] * (end - start)
            self._counters["stale_tokens_masked"] += masked
            self._counters["stale_turns_masked"] += len(sample.turn_spans) - len(fresh)
            if not any(mask):
                del self._entries[key]
                dropped += 1
                continue
            entry.sample = dataclasses.replace(
                sample, loss_mask=mask, old_logprobs=logprobs,
                policy_versions=[sample.policy_versions[i] for i in fresh],
                turn_spans=[sample.turn_spans[i] for i in fresh],
                metadata={**sample.metadata, "stale_tokens_masked":
                          sample.metadata.get("stale_tokens_masked", 0) + masked})
        self._counters["evicted_policy_age"] += dropped
        return dropped

    def sample(
        self, curr_policy_version: int, batch_size: int | None = None
    ) -> list[TrainSample] | list[list[TrainSample]] | None:
        """A batch for the trainer at ``curr_policy_version``, or ``None`` if one cannot be filled.

        Returns a flat list of ``batch_size`` samples when ``dp_size == 1``, else a list of
        ``dp_size`` shards of ``batch_size`` samples each. Stale samples are evicted first;
        samples used more than ``max_resample_count`` times leave the buffer.
        """
        batch_size = batch_size or self.config.batch_size
        self.evict(curr_policy_version)
        dp = self.config.dp_size
        if len(self._entries) < batch_size * dp:
            return None
        if self.config.keep_groups:
            shards = self._pick_groups(batch_size, dp)
            if shards is None:
                return None
        else:
            keys = self._rng.sample(list(self._entries), batch_size * dp)
            shards = [keys[i * batch_size : (i + 1) * batch_size] for i in range(dp)]

        batch = [[self._take(key) for key in shard] for shard in shards]
        self._counters["sampled"] += batch_size * dp
        self._counters["batches"] += 1
        return batch[0] if dp == 1 else batch

    def _pick_groups(self, batch_size: int, dp: int) -> list[list[int]] | None:
        """Whole groups filling ``dp`` shards of exactly ``batch_size``, or None if no choice of groups can.

        Groups of equal size are interchangeable for the fit, so the search runs over how many
        groups of each size go into each shard (exact, memoised); which groups of a size are
        used is then drawn at random.
        """
        groups: dict[Any, list[int]] = {}
        for key, entry in self._entries.items():
            gid = entry.sample.group_id if entry.sample.group_id is not None else ("__solo__", key)
            groups.setdefault(gid, []).append(key)
        by_size: dict[int, list[list[int]]] = {}
        for keys in groups.values():
            if len(keys) <= batch_size:
                by_size.setdefault(len(keys), []).append(keys)
        sizes = sorted(by_size)
        self._rng.shuffle(sizes)  # no systematic preference for one group size over another
        plan = _plan_shards(sizes, [len(by_size[size]) for size in sizes], batch_size, dp)
        if plan is None:
            return None
        for candidates in by_size.values():
            self._rng.shuffle(candidates)
        shards: list[list[int]] = []
        for shard_counts in plan:
            shard: list[int] = []
            for size, count in zip(sizes, shard_counts, strict=True):
                for _ in range(count):
                    shard.extend(by_size[size].pop())
            shards.append(shard)
        return shards

    def _take(self, key: int) -> TrainSample:
        entry = self._entries[key]
        entry.times_sampled += 1
        limit = self.config.max_resample_count
        if limit is not None and entry.times_sampled > limit:
            del self._entries[key]
            self._counters["evicted_resample"] += 1
        return entry.sample

    def clear(self) -> None:
        """Drop every sample (counters are kept)."""
        self._entries.clear()

    def age_histogram(self, curr_policy_version: int | None = None) -> dict[int, int]:
        """How many samples have each age (in policy versions) at ``curr_policy_version``."""
        version = self._last_version if curr_policy_version is None else curr_policy_version
        return dict(sorted(Counter(version - e.sample.min_policy_version for e in self._entries.values()).items()))

    def metrics(self, curr_policy_version: int | None = None) -> dict[str, float]:
        """Size, groups, age statistics and cumulative add/sample/eviction counters."""
        hist = self.age_histogram(curr_policy_version)
        n = len(self._entries)
        out: dict[str, float] = {
            "buffer/size": float(n),
            "buffer/groups": float(len({e.sample.group_id for e in self._entries.values()})),
            "buffer/age_mean": sum(age * c for age, c in hist.items()) / n if n else 0.0,
            "buffer/age_max": float(max(hist)) if hist else 0.0,
        }
        for age, count in hist.items():
            out[f"buffer/age_hist/{age}"] = float(count)
        for name in ("added", "sampled", "batches", "evicted_policy_age", "evicted_max_size", "evicted_resample",
                     "stale_tokens_masked", "stale_turns_masked"):
            out[f"buffer/{name}"] = float(self._counters[name])
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot: samples, reuse counts, RNG, counters."""
        version, internal, gauss = self._rng.getstate()
        return {
            "entries": [[key, e.times_sampled, e.sample.to_dict()] for key, e in self._entries.items()],
            "next_key": self._next_key,
            "last_version": self._last_version,
            "rng_state": [version, list(internal), gauss],
            "counters": dict(self._counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot taken by ``state_dict`` (the config stays this buffer's own)."""
        try:
            entries = OrderedDict(
                (int(key), _Entry(TrainSample.from_dict(sample), int(times)))
                for key, times, sample in state["entries"]
            )
            version, internal, gauss = state["rng_state"]
            self._rng.setstate((version, tuple(internal), gauss))
            self._next_key = int(state["next_key"])
            self._last_version = int(state["last_version"])
            self._counters = Counter(state["counters"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a ReplayBuffer state_dict ({exc!r}); pass what ReplayBuffer.state_dict() returned") from exc
        self._entries = entries


# Bounds the packing search; with the group sizes a GRPO loop produces it ends long before.
_MAX_PLAN_STEPS = 200_000


def _plan_shards(sizes: list[int], available: list[int], batch_size: int, dp: int) -> list[list[int]] | None:
    """For each of ``dp`` shards, how many groups of each size fill it to exactly ``batch_size``.

    ``available[i]`` groups have size ``sizes[i]``. Exact: returns None only when no assignment
    exists (or, for pathological inputs, after ``_MAX_PLAN_STEPS`` search steps).
    """
    dead_ends: set[tuple[tuple[int, ...], int]] = set()
    steps = 0

    def one_shard(index: int, room: int, left: list[int], chosen: list[int]) -> Iterable[list[int]]:
        nonlocal steps
        steps += 1
        if steps > _MAX_PLAN_STEPS:
            return
        if room == 0:
            yield list(chosen)
            return
        if index == len(sizes):
            return
        size = sizes[index]
        for count in range(min(left[index], room // size), -1, -1):
            chosen[index] = count
            yield from one_shard(index + 1, room - count * size, left, chosen)
        chosen[index] = 0

    def fill(left: list[int], shards: int) -> list[list[int]] | None:
        if shards == 0:
            return []
        state = (tuple(left), shards)
        if state in dead_ends or steps > _MAX_PLAN_STEPS:
            return None
        for counts in one_shard(0, batch_size, left, [0] * len(sizes)):
            rest = fill([a - c for a, c in zip(left, counts, strict=True)], shards - 1)
            if rest is not None:
                return [counts, *rest]
        dead_ends.add(state)
        return None

    return fill(list(available), dp)
