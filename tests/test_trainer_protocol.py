"""The ``Trainer`` protocol: ``TorchTrainer`` and ``TitanTrainer`` both satisfy it (Titan checked by
signature, so no torchtitan run is needed), a real ``TorchTrainer`` passes ``isinstance``, and the byte
tokenizer is a ``Tokenizer``."""

import ast
import inspect
import textwrap
import typing

import pytest

from forge_env.models import Tokenizer, build_byte_tokenizer
from forge_env.rl.protocols import Trainer
from forge_env.rl.titan import TitanTrainer
from forge_env.rl.trainer import TorchTrainer
from forge_env.weights import WeightStore
from tests.rl_support import sample, tiny_model

METHODS = [n for n, v in vars(Trainer).items() if inspect.isfunction(v) and not n.startswith("_")]
ATTRIBUTES = list(typing.get_type_hints(Trainer, localns={"Any": typing.Any, "WeightStore": WeightStore}))


def _parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def _assigned_in_init(cls) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_the_protocol_names_what_the_loops_use():
    assert set(METHODS) >= {"train_step", "push_weights", "save", "load", "logprobs"}
    assert set(ATTRIBUTES) >= {"policy_version", "step", "weight_store", "model"}


@pytest.mark.parametrize("cls", [TorchTrainer, TitanTrainer])
def test_both_trainers_have_the_protocol_signatures(cls):
    for name in METHODS:
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}()"
        assert _parameters(getattr(cls, name)) == _parameters(getattr(Trainer, name)), (cls.__name__, name)
    missing = set(ATTRIBUTES) - _assigned_in_init(cls)
    assert not missing, f"{cls.__name__}.__init__ does not set {sorted(missing)}"


def test_a_torch_trainer_is_a_trainer_and_tracks_the_version_it_pushed(tmp_path):
    store = WeightStore("trainer-protocol", root=tmp_path / "store")
    trainer = TorchTrainer(tiny_model(), device="cpu", loss="sft", lr=1e-2, weight_store=store)
    assert isinstance(trainer, Trainer)
    assert trainer.policy_version == 0
    trainer.train_step([sample([1, 2, 3], [4, 5])])
    trainer.push_weights(3)
    assert trainer.policy_version == 3 and store.latest_version() == 3


def test_an_object_without_the_methods_is_not_a_trainer():
    class Half:
        model = step = policy_version = 0
        weight_store = None

        def train_step(self, batch):
            return {}

    assert not isinstance(Half(), Trainer)


def test_the_byte_tokenizer_is_a_tokenizer():
    assert isinstance(build_byte_tokenizer(), Tokenizer)
    assert not isinstance(object(), Tokenizer)
