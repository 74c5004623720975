"""The weight hand-off's contract (``forge_env.weights``): sources, the explicit file route, and its place
between ``forge_env.rl`` and ``forge_env.generation`` (both import it; it imports neither; neither the other)."""

import ast
import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from forge_env.generation import WeightUpdateError
from forge_env.generation.base import fetch_weights as generator_fetch_weights
from forge_env.weights import (
    WeightFileSource,
    WeightSourceError,
    WeightStore,
    WeightVersionNotFound,
    fetch_weights,
    weights_file,
)

ROOT = Path(__file__).resolve().parents[1]
STATE = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}


class MemoryBackend:
    """A backend without files (a user's own ``WeightBackend``)."""

    def __init__(self) -> None:
        self.data: dict[int, dict[str, torch.Tensor]] = {}

    def put(self, state_dict, version):
        from forge_env.weights import WeightsInfo

        self.data[version] = dict(state_dict)
        return WeightsInfo(version, len(state_dict), 0)

    def get(self, version):
        return self.data[version]

    def versions(self):
        return sorted(self.data)

    def delete(self, version):
        self.data.pop(version, None)

    def clear(self):
        self.data.clear()


def test_a_store_names_its_files_and_only_the_store_does(tmp_path):
    store = WeightStore("contract", root=tmp_path / "store")
    store.put(STATE, 2)
    assert isinstance(store, WeightFileSource)
    assert weights_file(store, 2) == store.weights_path(2) and weights_file(store, 2).is_file()
    with pytest.raises(WeightVersionNotFound):
        weights_file(store, 3)
    # A bound method or any other callable is a plain source: no file, whoever it belongs to.
    assert not isinstance(store.load, WeightFileSource)
    assert weights_file(store.load, 2) is None
    assert weights_file(lambda version: STATE, 2) is None
    # A store on a backend without files says so.
    memory = WeightStore("contract-memory", backend=MemoryBackend())
    memory.put(STATE, 1)
    assert weights_file(memory, 1) is None


def test_every_kind_of_source_yields_the_weights(tmp_path):
    store = WeightStore("contract-fetch", root=tmp_path / "store")
    store.put(STATE, 4)

    async def later(version):
        return STATE, version

    async def fetch_all():
        return [
            await fetch_weights(store, 4),  # get(version) -> (weights, version)
            await fetch_weights(store.load, 4),  # version -> weights
            await fetch_weights(later, 4),  # awaitable pair
            await fetch_weights({4: STATE}.__getitem__, 4),
        ]

    for got in asyncio.run(fetch_all()):
        assert torch.equal(got["w"], STATE["w"])


def test_something_that_is_no_source_is_refused_clearly():
    with pytest.raises(WeightSourceError, match="neither callable nor has get"):
        asyncio.run(fetch_weights(42, 1))
    # A generator reports it as a failed update.
    with pytest.raises(WeightUpdateError, match="neither callable nor has get"):
        asyncio.run(generator_fetch_weights(42, 1))


def _imported_modules(package: str) -> dict[str, set[str]]:
    """``forge_env`` modules imported anywhere (functions included) in each file of ``package``."""
    found = {}
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[str(path.relative_to(ROOT))] = {n for n in names if n.startswith("forge_env")}
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("forge_env.weights", ("forge_env.rl", "forge_env.generation")),
        ("forge_env.rl", ("forge_env.generation",)),
        ("forge_env.generation", ("forge_env.rl",)),
    ],
)
def test_the_hand_off_sits_between_rl_and_generation(package, forbidden):
    offending = {
        path: sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))
        for path, names in _imported_modules(package).items()
    }
    assert not {p: n for p, n in offending.items() if n}, f"{package} imports {forbidden}"
    assert any(names for names in _imported_modules(package).values()), "the scan found no imports at all"


def test_the_contract_imports_without_torch():
    code = "import sys, forge_env.weights, forge_env.generation; assert 'torch' not in sys.modules, 'torch'"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
