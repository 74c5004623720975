"""The ring backend: reused pre-faulted slots, and a protocol under which no reader ever sees a torn
version, tested with real processes (a writer and readers hammering, a reader and a writer killed)."""

import multiprocessing
import os
import signal
import time

import pytest
import torch

from forge_env.weights import WeightStore, WeightStoreError, WeightVersionNotFound
from tests.test_rl_weight_store import mixed_state

SIZE = 1 << 20  # elements per tensor: copies long enough for readers to land in the middle of a push


@pytest.fixture
def ring(tmp_path):
    s = WeightStore("ring", backend="ring", root=tmp_path / "ring", keep_versions=2)
    yield s
    s.clear()


def filled(version: int) -> dict[str, torch.Tensor]:
    """Every element of every tensor equals ``version``: a torn read shows two values."""
    return {f"layer{i}.weight": torch.full((SIZE,), float(version)) for i in range(3)} | {
        "step": torch.full((8,), version, dtype=torch.int64)}


def check_filled(state, version: int) -> None:
    for name, tensor in state.items():
        lo, hi = tensor.min().item(), tensor.max().item()
        assert lo == hi == version, f"{name}: values {lo}..{hi} in version {version} (torn)"


def test_round_trip_every_dtype_and_a_standard_safetensors_file(ring):
    from safetensors.torch import load_file

    state = mixed_state(0)
    ring.put(state, 3)
    got, version = ring.get()
    assert version == 3 and set(got) == set(state)
    for name, tensor in state.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    assert got.immutable_views
    with ring.hold(3) as path:
        loaded = load_file(str(path))
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert ring.get(3, verify=True)[1] == 3


def test_slots_are_reused_and_a_held_slot_is_never_overwritten(ring):
    for version in range(1, 8):
        ring.put(filled(version), version)
    assert ring.versions() == [6, 7]
    assert len(list(ring.backend.root.glob("slot-*"))) == 2  # double-buffered: two slots for seven versions
    held, _ = ring.get(7)
    for version in range(8, 12):
        ring.put(filled(version), version)
        check_filled(held, 7)  # the writer went around the slot this reader holds
    assert ring.versions() == [10, 11]
    assert len(list(ring.backend.root.glob("slot-*"))) == 3
    del held  # the views were the lease: the slot is free again
    for version in range(12, 16):
        ring.put(filled(version), version)
    assert len(list(ring.backend.root.glob("slot-*"))) == 3
    with pytest.raises(WeightVersionNotFound, match="version 7 is not in"):
        ring.get(7)


def test_a_private_write_stays_private_and_a_full_ring_says_why(tmp_path):
    store = WeightStore("full", backend="ring", root=tmp_path / "r", keep_versions=1, max_slots=2)
    store.put(filled(1), 1)
    first, _ = store.get(1)
    first["step"].add_(100)  # copy-on-write: the slot keeps version 1
    check_filled(store.get(1)[0], 1)
    store.put(filled(2), 2)
    second, _ = store.get(2)
    with pytest.raises(WeightStoreError, match="held by readers"):
        store.put(filled(3), 3)
    del first
    store.put(filled(3), 3)
    check_filled(second, 2)
    store.clear()


def test_a_corrupted_slot_fails_its_checksum_unless_the_reader_opts_out(ring):
    ring.put(filled(1), 1)
    with ring.hold(1) as path:
        with open(path, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"\x01\x02\x03\x04")
    with pytest.raises(WeightStoreError, match="checksum"):
        ring.get(1, verify=True)
    ring.get(1, verify=False)  # no pass over the bytes: the lock protocol alone


def test_the_store_pickles_to_its_settings(ring):
    import pickle

    ring.put(filled(4), 4)
    clone = pickle.loads(pickle.dumps(ring))
    check_filled(clone.get(4)[0], 4)


# ------------------------------------------------------------------ processes


def _writer(root, versions, ready):
    store = WeightStore("ring", backend="ring", root=root, keep_versions=2)
    ready.wait()
    for version in range(1, versions + 1):
        store.put(filled(version), version)


def _reader(root, stop, results, copy):
    store = WeightStore("ring", backend="ring", root=root, keep_versions=2)
    reads = misses = 0
    target = filled(0)
    while not stop.is_set() or reads == 0:
        version = store.latest_version()
        if version is None:
            continue
        try:
            if copy:
                store.backend.read_into(version, target)
                state = target
            else:
                state, _ = store.get(version, verify=False)
        except WeightVersionNotFound:  # overwritten between listing and locking: not torn, just gone
            misses += 1
            continue
        check_filled(state, version)  # raises (and the process exits non-zero) on a torn version
        del state
        reads += 1
    results.put((reads, misses))


def test_a_writer_and_readers_hammering_never_see_a_torn_version(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    root = tmp_path / "ring"
    WeightStore("ring", backend="ring", root=root).put(filled(0), 0)
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(root, stop, results, copy)) for copy in (False, True)]
    writer = ctx.Process(target=_writer, args=(root, 60, ready))
    for p in (*readers, writer):
        p.start()
    ready.set()
    writer.join(300)
    stop.set()
    for p in readers:
        p.join(120)
    assert writer.exitcode == 0 and [p.exitcode for p in readers] == [0, 0]
    counts = [results.get(timeout=10) for _ in readers]
    assert all(reads > 0 for reads, _ in counts), counts
    store = WeightStore("ring", backend="ring", root=root)
    assert store.versions() == [59, 60]
    check_filled(store.get()[0], 60)
    store.clear()


def _hold_and_sleep(root, version, ready):
    store = WeightStore("ring", backend="ring", root=root)
    state, _ = store.get(version)
    ready.set()
    time.sleep(600)
    del state


def test_a_reader_killed_while_holding_a_version_frees_its_slot(ring):
    ctx = multiprocessing.get_context("spawn")
    ring.put(filled(1), 1)
    ring.put(filled(2), 2)
    ready = ctx.Event()
    reader = ctx.Process(target=_hold_and_sleep, args=(ring.backend.root, 2, ready))
    reader.start()
    try:
        assert ready.wait(120)
        for version in range(3, 6):
            ring.put(filled(version), version)
        assert len(list(ring.backend.root.glob("slot-*"))) == 3  # slot of version 2 held
    finally:
        os.kill(reader.pid, signal.SIGKILL)
        reader.join(30)
    for version in range(6, 12):
        ring.put(filled(version), version)
    assert len(list(ring.backend.root.glob("slot-*"))) == 3  # no more slots: the dead reader's is reused
    held = {r.index for r in ring.backend.records() if r.state == "C"}
    assert len(held) == 2 and ring.versions() == [10, 11]


class _Stall:
    """A tensor-like value whose copy never finishes: the push is killed in the middle of its write."""

    dtype, shape = torch.float32, (4,)

    def __init__(self, fifo):
        self.fifo = fifo

    def element_size(self):
        return 4

    def numel(self):
        return 4

    def detach(self):
        with open(self.fifo, "w") as f:
            f.write("writing")
        time.sleep(600)


def _push_then_stall(root, fifo):
    store = WeightStore("ring", backend="ring", root=root, keep_versions=2)
    state = filled(2) | {"zz.stall": _Stall(fifo)}  # copied last, after every real tensor was overwritten
    store.put(state, 2)


def test_a_writer_killed_mid_write_leaves_the_previous_version_readable(ring, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    layout = filled(1) | {"zz.stall": torch.full((4,), 1.0)}
    ring.put(layout, 1)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = ctx.Process(target=_push_then_stall, args=(ring.backend.root, fifo))
    writer.start()
    try:
        with open(fifo) as f:
            assert f.read() == "writing"
        states = {r.index: r.state for r in ring.backend.records()}
        assert sorted(states.values()) == ["C", "W"]
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
    assert ring.versions() == [1]
    check_filled({k: v for k, v in ring.get(1, verify=True)[0].items() if k != "zz.stall"}, 1)
    with pytest.raises(WeightVersionNotFound):
        ring.get(2)
    ring.put(layout | filled(2), 2)  # the abandoned slot is written again
    assert ring.versions() == [1, 2] and len(list(ring.backend.root.glob("slot-*"))) == 2
    check_filled({k: v for k, v in ring.get(2)[0].items() if k != "zz.stall"}, 2)
