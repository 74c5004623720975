"""ReplayBuffer: sampling, eviction rules, group-aware and dp-sharded batches, state round-trip."""

import json
from collections import Counter

import pytest

from forge_env.rl.buffer import ReplayBuffer, ReplayBufferConfig
from tests.rl_support import sample


def episodes(n, *, versions=(0,), group_size=1, start=0):
    return [
        sample([1, 2], [3 + i % 7], episode_id=f"e{start + i}", group_id=f"g{(start + i) // group_size}",
               policy_versions=list(versions))
        for i in range(n)
    ]  # fmt: skip


def ids(batch):
    return [s.episode_id for s in batch]


def test_returns_none_until_a_batch_can_be_filled():
    buf = ReplayBuffer(batch_size=4)
    buf.add(episodes(3))
    assert buf.sample(curr_policy_version=0) is None
    buf.add(episodes(1, start=3))
    batch = buf.sample(curr_policy_version=0)
    assert sorted(ids(batch)) == ["e0", "e1", "e2", "e3"]


def test_each_sample_used_once_by_default_and_resample_count_allows_reuse():
    buf = ReplayBuffer(batch_size=2)
    buf.add(episodes(4))
    seen = ids(buf.sample(0)) + ids(buf.sample(0))
    assert sorted(seen) == ["e0", "e1", "e2", "e3"]
    assert len(buf) == 0 and buf.sample(0) is None
    assert buf.metrics()["buffer/evicted_resample"] == 4

    reuse = ReplayBuffer(batch_size=2, max_resample_count=2)
    reuse.add(episodes(2))
    drawn = [ids(reuse.sample(0)) for _ in range(3)]
    assert all(sorted(d) == ["e0", "e1"] for d in drawn)  # each used 3 times = 1 + 2 resamples
    assert reuse.sample(0) is None


def test_policy_age_counts_from_the_oldest_turn():
    buf = ReplayBuffer(batch_size=1, max_policy_age=2, max_resample_count=None)
    buf.add(sample([1], [2], episode_id="old", policy_versions=[0, 3]))  # age at v3 = 3
    buf.add(sample([1], [2], episode_id="fresh", policy_versions=[1, 3]))  # age at v3 = 2
    assert buf.age_histogram(3) == {2: 1, 3: 1}
    assert ids(buf.sample(curr_policy_version=3)) == ["fresh"]
    assert len(buf) == 1
    assert buf.metrics()["buffer/evicted_policy_age"] == 1
    assert buf.sample(curr_policy_version=4) is None  # now "fresh" is 3 versions old too
    assert len(buf) == 0


def test_max_size_drops_the_oldest():
    buf = ReplayBuffer(batch_size=2, max_size=3, max_resample_count=None)
    buf.add(episodes(5))
    assert len(buf) == 3
    assert buf.metrics()["buffer/evicted_max_size"] == 2
    drawn = Counter(e for _ in range(20) for e in ids(buf.sample(0)))
    assert set(drawn) == {"e2", "e3", "e4"}


def test_keep_groups_samples_whole_groups_only():
    buf = ReplayBuffer(batch_size=6, keep_groups=True)
    buf.add(episodes(9, group_size=3))
    batch = buf.sample(0)
    groups = Counter(s.group_id for s in batch)
    assert len(batch) == 6 and sorted(groups.values()) == [3, 3]
    # One group of 3 left: cannot fill 6 without splitting a group.
    assert buf.sample(0) is None and len(buf) == 3


def test_keep_groups_cannot_fill_exactly_returns_none_without_side_effects():
    buf = ReplayBuffer(batch_size=4, keep_groups=True)
    buf.add(episodes(6, group_size=3))
    assert buf.sample(0) is None
    assert len(buf) == 6 and buf.metrics()["buffer/sampled"] == 0
    buf.add(sample([1], [2], episode_id="solo", group_id="g-solo"))
    batch = buf.sample(0)
    assert sorted(Counter(s.group_id for s in batch).values()) == [1, 3]


def test_dp_shards_with_whole_groups():
    buf = ReplayBuffer(batch_size=4, dp_size=2, keep_groups=True)
    buf.add(episodes(8, group_size=2))
    shards = buf.sample(0)
    assert len(shards) == 2 and all(len(s) == 4 for s in shards)
    groups = [{s.group_id for s in shard} for shard in shards]
    assert not groups[0] & groups[1]
    assert sorted(ids(shards[0] + shards[1])) == sorted(f"e{i}" for i in range(8))


def test_state_dict_round_trip_restores_samples_counts_and_rng():
    cfg = ReplayBufferConfig(batch_size=3, max_resample_count=1, seed=7)
    buf = ReplayBuffer(cfg)
    buf.add(episodes(10, versions=(0, 1)))
    buf.sample(1)
    state = json.loads(json.dumps(buf.state_dict()))  # must be JSON-serialisable
    restored = ReplayBuffer(cfg)
    restored.load_state_dict(state)
    assert len(restored) == len(buf)
    assert restored.metrics(2) == buf.metrics(2)
    for _ in range(4):
        a, b = buf.sample(2), restored.sample(2)
        assert (a is None and b is None) or ids(a) == ids(b)
    with pytest.raises(ValueError, match="not a ReplayBuffer state_dict"):
        restored.load_state_dict({"entries": []})


def test_metrics_and_bad_input():
    buf = ReplayBuffer(batch_size=2, max_resample_count=None)
    buf.add(episodes(2, versions=(1,)) + episodes(1, versions=(3,), start=2))
    buf.sample(4)
    m = buf.metrics()
    assert m["buffer/size"] == 3 and m["buffer/added"] == 3 and m["buffer/batches"] == 1
    assert m["buffer/age_hist/3"] == 2 and m["buffer/age_hist/1"] == 1
    assert m["buffer/age_max"] == 3
    with pytest.raises(TypeError, match="TrainSample"):
        buf.add([{"token_ids": [1]}])
    with pytest.raises(ValueError, match="smaller than one batch"):
        ReplayBufferConfig(batch_size=4, dp_size=2, max_size=7)


async def test_buffer_actor_in_its_own_process_round_trips_state():
    from forge_env.rl.buffer_actor import ReplayBufferActor

    actor = await ReplayBufferActor.options(procs=1).as_actor(batch_size=4, keep_groups=True, seed=3)
    try:
        assert await actor.add.call_one(episodes(6, group_size=2)) == 6
        assert await actor.sample.call_one(0, 8) is None
        batch = await actor.sample.call_one(curr_policy_version=0)
        assert len(batch) == 4 and sorted(Counter(s.group_id for s in batch).values()) == [2, 2]
        state = await actor.state_dict.call_one()
        assert (await actor.metrics.call_one())["buffer/size"] == 2
        assert await actor.num_samples.call_one() == 2
    finally:
        await ReplayBufferActor.shutdown(actor)
    local = ReplayBuffer(batch_size=2, keep_groups=True)
    local.load_state_dict(state)
    rest = local.sample(0)
    assert {s.episode_id for s in rest}.isdisjoint(s.episode_id for s in batch)


def _fillable(sizes, batch_size, dp):
    """Brute force: can disjoint whole groups of these sizes fill dp shards of exactly batch_size?"""
    import itertools

    def fill(left, shards):
        if shards == 0:
            return True
        for r in range(1, len(left) + 1):
            for combo in itertools.combinations(range(len(left)), r):
                if sum(left[i] for i in combo) == batch_size:
                    if fill([s for i, s in enumerate(left) if i not in combo], shards - 1):
                        return True
        return False

    return fill(list(sizes), dp)


def test_keep_groups_fills_a_batch_whenever_whole_groups_can():
    import random

    rng = random.Random(0)
    for seed in range(100):
        batch_size, dp = rng.choice([(6, 1), (8, 1), (4, 2), (5, 2)])
        sizes = [rng.randint(1, batch_size) for _ in range(rng.randint(2, 6))]
        buf = ReplayBuffer(batch_size=batch_size, dp_size=dp, keep_groups=True, seed=seed)
        start = 0
        for g, size in enumerate(sizes):
            buf.add([sample([1], [2], episode_id=f"e{start + i}", group_id=f"g{g}") for i in range(size)])
            start += size
        batch = buf.sample(0)
        expected = _fillable(sizes, batch_size, dp)
        assert (batch is not None) == expected, (seed, sizes, batch_size, dp)
        if batch is not None:
            shards = [batch] if dp == 1 else batch
            assert all(len(shard) == batch_size for shard in shards)
            taken = Counter(s.group_id for shard in shards for s in shard)
            assert all(taken[g] == sizes[int(g[1:])] for g in taken)  # whole groups only


def test_keep_groups_never_samples_a_group_larger_than_the_batch():
    buf = ReplayBuffer(batch_size=4, keep_groups=True)
    buf.add(episodes(5, group_size=5))
    assert buf.sample(0) is None and len(buf) == 5
