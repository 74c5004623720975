"""A version pulled over Monarch while the trainer still pushes it: the pull runs alongside the push (chunks
land before the push completes), the host's copy becomes readable only once the push completed and its
checksum matched, and a push killed half way leaves the host on its previous version."""

import asyncio
import multiprocessing
import os
import signal

import pytest
import torch

from forge_env.weights import WeightPushGone, WeightStore
from forge_env.weights.relay import RemoteWeightSource, spawn_weight_server
from forge_env.weights.relay_server import rdma_backend
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(400)
TRANSPORTS = ["messages"] + (["rdma"] if rdma_backend() != "none" else [])  # rdma: here Monarch's TCP fallback
CHUNK = 64 << 10


def state_of(version: int) -> dict[str, torch.Tensor]:
    """4 MiB of float32 whose every element is ``version``, and a last tensor (``zz.gate``) of 4 elements."""
    return {f"layer{i}": torch.full((256, 1024), float(version)) for i in range(4)} | {
        "zz.gate": torch.full((4,), float(version))}


class _Gate:
    """A tensor-like value copied last: says so through ``said``, then waits until a line arrives on ``go``
    (the test lets the push finish) or forever (the test kills the pushing process)."""

    dtype, shape = torch.float32, (4,)

    def __init__(self, version, said, go):
        self.version, self.said, self.go = version, said, go

    def element_size(self):
        return 4

    def numel(self):
        return 4

    def detach(self):
        with open(self.said, "w") as f:
            f.write("writing")
        with open(self.go) as f:
            f.read()
        return torch.full((4,), float(self.version))


def _push_through_gate(root, version, said, go):
    store = WeightStore("live", backend="ring", root=root, keep_versions=2)
    store.put(state_of(version) | {"zz.gate": _Gate(version, said, go)}, version)


class _Landing(RemoteWeightSource):
    """Records the offset of every chunk that lands."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.landed = []

    def _receive(self, desc, view, start, follow=None):
        for offset, length in super()._receive(desc, view, start, follow):
            self.landed.append(offset)
            yield offset, length


def host_versions(base):
    (host,) = sorted(base.iterdir())
    return WeightStore("host", backend="ring", root=host).versions()


async def start_gated_push(tmp_path, version):
    """A process pushing ``version`` into the trainer's ring that stops before its last tensor; returns it
    once it got there (every chunk but the last written) and the fifo that lets it go on."""
    said, go = tmp_path / f"said-{version}", tmp_path / f"go-{version}"
    os.mkfifo(said)
    os.mkfifo(go)
    writer = multiprocessing.get_context("spawn").Process(
        target=_push_through_gate, args=(tmp_path / "trainer", version, said, go))
    writer.start()

    def wait_said():
        with open(said) as f:
            return f.read()

    assert await asyncio.to_thread(wait_said) == "writing"
    return writer, go


async def setup(tmp_path, transport):
    store = WeightStore("live", backend="ring", root=tmp_path / "trainer", keep_versions=2)
    store.put(state_of(1), 1)
    server, procs = await spawn_weight_server(store)
    source = _Landing(server, "live", host_key=lambda: "host-a", root_base=str(tmp_path / "hosts"),
                      chunk_bytes=CHUNK, transport=transport)
    got, version = await source.get(1)
    assert version == 1 and host_versions(tmp_path / "hosts") == [1]
    source.landed.clear()
    return store, procs, source


def check(state, version):
    for name, tensor in state.items():
        assert torch.equal(tensor, torch.full_like(tensor, float(version))), name


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_pull_started_during_the_push_lands_chunks_early_and_completes_only_with_it(tmp_path, transport):
    store, procs, source = await setup(tmp_path, transport)
    writer, go = await start_gated_push(tmp_path, 2)
    try:
        pull = asyncio.create_task(source.get(2))
        # Every chunk the push has written lands while the push is still stopped at its last tensor...
        await wait_until(lambda: len(source.landed) >= (4 << 20) // CHUNK, timeout=120)
        await asyncio.sleep(0.5)
        assert not pull.done() and host_versions(tmp_path / "hosts") == [1]  # ...and none is readable here
        assert len(source.landed) == (4 << 20) // CHUNK  # nothing past what was written was asked for
        with open(go, "w") as f:
            f.write("go")
        got, version = await asyncio.wait_for(pull, 120)
        assert version == 2 and source.last_transport == transport
        check(got, 2)
        assert host_versions(tmp_path / "hosts") == [1, 2]
        source.local_store().get(2, verify=True)  # the trainer's checksum holds end to end
    finally:
        writer.join(60)
        if writer.exitcode is None:
            os.kill(writer.pid, signal.SIGKILL)
        await procs.stop()
        store.clear()
    assert writer.exitcode == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_push_killed_half_way_leaves_the_pulling_host_on_its_previous_version(tmp_path, transport):
    store, procs, source = await setup(tmp_path, transport)
    writer, _ = await start_gated_push(tmp_path, 2)
    try:
        pull = asyncio.create_task(source.get(2))
        await wait_until(lambda: len(source.landed) >= (4 << 20) // CHUNK, timeout=120)
        os.kill(writer.pid, signal.SIGKILL)
        with pytest.raises(WeightPushGone, match="stopped"):
            await asyncio.wait_for(pull, 120)
        assert host_versions(tmp_path / "hosts") == [1]
        check((await source.get(1))[0], 1)
        # The version pushed again (other bytes): its pull starts over, not from what the dead push had sent.
        source.landed.clear()
        store.put(state_of(3) | {"zz.gate": torch.full((4,), 3.0)}, 2)
        got, version = await asyncio.wait_for(source.get(2), 120)
        assert version == 2 and source.landed[0] == 0
        check(got, 3)
        source.local_store().get(2, verify=True)
    finally:
        writer.join(30)
        await procs.stop()
        store.clear()
