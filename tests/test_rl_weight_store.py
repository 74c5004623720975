"""WeightStore: versioned put/get on shared memory, old versions dropped, safetensors
layout, reads from another (Monarch) process, clear errors."""

import importlib.util
import pickle

import pytest
import torch
from monarch.actor import this_host

from forge_env.weights import (
    SharedMemoryBackend,
    WeightStore,
    WeightStoreError,
    WeightVersionNotFound,
)
from forge_env.weights.store import WEIGHT_BACKENDS
from tests.rl_actors import WeightReader


@pytest.fixture
def store(tmp_path):
    s = WeightStore("test", root=tmp_path / "w", keep_versions=2)
    yield s
    s.clear()


def mixed_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "w.f32": torch.randn(5, 7, generator=g),
        "w.bf16": torch.randn(3, 4, generator=g).to(torch.bfloat16),
        "w.f16": torch.randn(9, generator=g).half(),
        "steps.i64": torch.arange(4),
        "mask.bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "strided": torch.randn(4, 6, generator=g).t(),  # non-contiguous
    }


def test_round_trip_every_dtype_and_shape(store):
    state = mixed_state()
    info = store.put(state, 3)
    assert info.version == 3 and info.num_tensors == len(state)
    got, version = store.get()
    assert version == 3
    assert set(got) == set(state)
    for name, tensor in state.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name


def test_file_is_standard_safetensors(store):
    from safetensors.torch import load_file

    state = mixed_state()
    store.put(state, 0)
    loaded = load_file(str(store.backend.path(0)))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_old_versions_are_dropped_and_latest_wins(store):
    for v in range(5):
        store.put({"x": torch.full((2,), float(v))}, v)
    assert store.versions() == [3, 4]
    assert store.get(3)[0]["x"].tolist() == [3.0, 3.0]
    assert store.get()[1] == 4
    with pytest.raises(WeightVersionNotFound, match="version 1"):
        store.get(1)


def test_readers_keep_their_view_when_a_version_is_dropped(store):
    store.put({"x": torch.ones(4)}, 0)
    view, _ = store.get(0)
    copied, _ = store.get(0, copy=True)
    for v in (1, 2, 3):
        store.put({"x": torch.zeros(4)}, v)
    assert 0 not in store.versions()
    assert view["x"].tolist() == [1.0] * 4 and copied["x"].tolist() == [1.0] * 4


def test_empty_store_and_bad_input_errors(store):
    with pytest.raises(WeightVersionNotFound, match="has not pushed"):
        store.get()
    with pytest.raises(WeightStoreError, match="empty state dict"):
        store.put({}, 0)
    with pytest.raises(ValueError, match="non-negative"):
        store.put({"x": torch.ones(1)}, -1)
    with pytest.raises(WeightStoreError, match="dtype"):
        store.put({"x": torch.ones(1, dtype=torch.complex64)}, 0)
    with pytest.raises(ValueError, match="unknown weight store backend"):
        WeightStore(backend="redis")  # type: ignore[arg-type]


def test_torchstore_is_not_a_backend_and_says_so():
    # Removed (issue 47): torchstore 0.1.2 pins torchmonarch 0.1.2 / torch 2.9 and never ran with this Monarch.
    with pytest.raises(WeightStoreError, match=r"^torchstore is not supported: .*torchmonarch 0\.1\.2"):
        WeightStore("ts", backend="torchstore")  # type: ignore[arg-type]
    assert "torchstore" not in WEIGHT_BACKENDS
    assert importlib.util.find_spec("forge_env.weights.torchstore_backend") is None


def test_store_pickles_to_its_settings(store):
    clone = pickle.loads(pickle.dumps(store))
    assert isinstance(clone.backend, SharedMemoryBackend) and clone.backend.root == store.backend.root
    store.put({"x": torch.ones(1)}, 7)
    assert clone.latest_version() == 7


async def test_another_monarch_process_reads_the_pushed_version(store):
    state = mixed_state(seed=3)
    store.put(state, 11)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        reader = procs.spawn("weight_reader", WeightReader)
        version, sums = await reader.checksum.call_one(store, None)
    finally:
        await procs.stop()
    assert version == 11
    assert sums == {k: float(t.double().sum()) for k, t in state.items()}


def test_load_into_reads_straight_into_parameters_and_checks_shapes(store):
    src, dst = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    store.put(src.state_dict(), 1)
    weight_ptr = dst.weight.data_ptr()
    assert store.load_into(dst) == 1
    assert dst.weight.data_ptr() == weight_ptr  # filled in place
    assert torch.equal(dst.weight, src.weight) and torch.equal(dst.bias, src.bias)
    half = torch.nn.Linear(4, 3).to(torch.bfloat16)  # other dtype: read, then cast in
    store.load_into(half)
    assert torch.equal(half.weight, src.weight.to(torch.bfloat16))
    with pytest.raises(WeightStoreError, match="shape"):
        store.load_into(torch.nn.Linear(5, 3))
    with pytest.raises(WeightStoreError, match="missing"):
        store.load_into(torch.nn.Sequential(torch.nn.Linear(4, 3)))


def test_load_shared_adopts_store_views_without_copying_and_keeps_ties(store):
    from tests.rl_support import tiny_model

    trainer_model, generator_model = tiny_model(0), tiny_model(1)
    store.put(trainer_model.state_dict(), 1)
    before = {name: p.data_ptr() for name, p in generator_model.named_parameters()}
    assert store.load_shared(generator_model, 1) == 1
    for name, param in generator_model.state_dict().items():
        assert torch.equal(param, trainer_model.state_dict()[name]), name
    assert all(p.data_ptr() != before[name] for name, p in generator_model.named_parameters())  # mapped, not filled
    assert generator_model.lm_head.weight is generator_model.model.embed_tokens.weight  # still tied
    with torch.no_grad():
        for param in trainer_model.parameters():
            param.add_(1.0)  # later training must not show through
        store.put(trainer_model.state_dict(), 2)
    assert not torch.equal(generator_model.model.embed_tokens.weight, trainer_model.model.embed_tokens.weight)
    with torch.no_grad():
        generator_model.model.norm.weight.mul_(2.0)  # a write stays private (copy-on-write)
    assert torch.equal(store.get(1)[0]["model.norm.weight"], trainer_model.model.norm.weight - 1.0)
    half = tiny_model(2).to(torch.bfloat16)  # other dtype: falls back to a copy
    assert store.load_shared(half, 2) == 2
    assert torch.equal(half.model.norm.weight, trainer_model.model.norm.weight.to(torch.bfloat16))


async def test_a_generator_adopts_store_versions_but_copies_live_tensors(store):
    from forge_env.generation.hf import HFGenerator
    from forge_env.models import build_byte_tokenizer
    from tests.rl_support import tiny_model

    trainer_model = tiny_model(0)
    generator = HFGenerator(tiny_model(1), build_byte_tokenizer(), weight_source=store)
    try:
        store.put(trainer_model.state_dict(), 1)
        await generator.update_weights(1)
        embed = generator.model.model.embed_tokens.weight
        assert torch.equal(embed, trainer_model.model.embed_tokens.weight)
        assert generator.model.lm_head.weight is embed
        await generator.load_state_dict(trainer_model.state_dict(), 2)  # the trainer's own tensors
        with torch.no_grad():
            trainer_model.model.embed_tokens.weight.add_(1.0)
        assert not torch.equal(generator.model.model.embed_tokens.weight, trainer_model.model.embed_tokens.weight)
    finally:
        generator.close()
