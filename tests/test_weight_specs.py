"""Reading safetensors without copying, and the check a weight update passes before a generator loads it."""

import pytest
import torch
from safetensors.torch import load_file

from forge_env.models import build_tiny_model, save_tiny_model
from forge_env.weights import WeightMismatchError, WeightStore, WeightVersionNotFound
from forge_env.weights.safetensors_io import SafetensorsError, map_safetensors, read_safetensors_specs
from forge_env.weights.specs import ModelWeightSpecs


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_a_checkpoint_maps_to_the_same_tensors_and_specs(checkpoint):
    expected = load_file(str(checkpoint / "model.safetensors"))
    mapped = map_safetensors(checkpoint)  # a directory: all its *.safetensors
    assert mapped.keys() == expected.keys() and "lm_head.weight" not in mapped  # HF leaves the tied head out
    assert all(torch.equal(mapped[k], expected[k]) for k in expected)
    specs = read_safetensors_specs(checkpoint / "model.safetensors")
    assert {k: (s.dtype, s.shape) for k, s in specs.items()} == {k: (t.dtype, tuple(t.shape)) for k, t in expected.items()}


def test_truncated_or_foreign_files_are_refused_by_their_header(tmp_path, checkpoint):
    data = (checkpoint / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with pytest.raises(SafetensorsError, match="truncated"):
        read_safetensors_specs(tmp_path / "cut.safetensors")
    (tmp_path / "text.safetensors").write_bytes(b"hello world, not safetensors")
    with pytest.raises(SafetensorsError, match="not a safetensors file"):
        map_safetensors(tmp_path / "text.safetensors")
    with pytest.raises(SafetensorsError, match="no safetensors weights"):
        map_safetensors(tmp_path / "missing")


def test_the_store_hands_out_the_file_of_a_version(tmp_path):
    store = WeightStore("specs", root=tmp_path / "store")
    state = build_tiny_model(1).state_dict()
    store.put(state, 3)
    path = store.weights_path(3)
    assert torch.equal(map_safetensors(path)["model.norm.weight"], state["model.norm.weight"])
    with pytest.raises(WeightVersionNotFound):
        store.weights_path(4)


def test_updates_must_fit_the_model_parameters(checkpoint):
    specs = ModelWeightSpecs.from_pretrained(checkpoint)
    assert specs.tied_head and "lm_head.weight" in specs.specs
    state = build_tiny_model(2).state_dict()
    specs.check(state, "full")
    specs.check({k: v for k, v in state.items() if k != "lm_head.weight"}, "headless")  # tied: may be left out
    specs.check({k: v.to(torch.bfloat16) for k, v in state.items()}, "bf16")  # cast on load
    specs.check(read_safetensors_specs(checkpoint), "a checkpoint's header")
    bad = {k: v for k, v in state.items() if k != "model.embed_tokens.weight"}
    bad["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 3)
    bad["extra.weight"] = torch.zeros(1)
    bad["model.norm.weight"] = torch.zeros(256, dtype=torch.int64)
    with pytest.raises(WeightMismatchError) as error:
        specs.check(bad, "version 9")
    message = str(error.value)
    for part in ("version 9 does not fit", "missing 1 parameters ['model.embed_tokens.weight']",
                 "unknown names ['extra.weight']", "q_proj.weight: [3, 3] (model: [256, 256])",
                 "model.norm.weight: torch.int64"):
        assert part in message, (part, message)
