"""Weights across hosts over Monarch actor messages: two ProcessJob hosts whose generators can only reach
the trainer's weights through the WeightServer (their source names no file of the trainer's), each host
keeping its own copy; every version arrives, logprobs equal the trainer's, a wiped host catches up."""

import asyncio
import os
import pickle
import shutil
import sys

import pytest
import torch

from forge_env.rl.trainer import TorchTrainer
from forge_env.services import placement
from forge_env.weights import WeightStore, WeightStoreError
from forge_env.weights.relay import RemoteWeightSource, host_key_session, spawn_weight_server
from forge_env.weights.relay_server import rdma_backend
from tests.rl_actors import TinyPolicyGenerator
from tests.rl_support import sample, tiny_model
from tests.test_hosts import jobs, kill_host, start_job  # noqa: F401  (jobs: the fixture that kills the job afterwards)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(400)
PROMPT = [5, 17, 42, 9, 100, 7]
BATCH = [sample(PROMPT, [200, 201, 202, 203]), sample([8, 9], [150, 151, 152])]
TRANSPORTS = ["messages"] + (["rdma"] if rdma_backend() != "none" else [])  # rdma: here Monarch's TCP fallback


def host_rings(base):
    """Each host's ring directory -> the versions complete in it."""
    return {d.name: WeightStore(d.name, backend="ring", root=d).versions() for d in sorted(base.iterdir())}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_generators_on_two_hosts_receive_every_version_without_a_shared_file(jobs, tmp_path, transport):  # noqa: F811
    _, mesh = start_job(2, jobs)
    placement.register_hosts("cpu", mesh)
    store = WeightStore("relay", backend="ring", root=tmp_path / "trainer")
    trainer = TorchTrainer(tiny_model(seed=0), device="cpu", loss="sft", lr=2e-2, weight_store=store)
    server, procs = await spawn_weight_server(store)
    source = RemoteWeightSource(server, "relay", host_key=host_key_session, root_base=str(tmp_path / "hosts"),
                                chunk_bytes=64 << 10, transport=transport)
    assert str(store.backend.root).encode() not in pickle.dumps(source)  # the generators cannot name its files
    gens = await TinyPolicyGenerator.options(num_replicas=2, hosts="cpu", replicas_per_host=1).as_service(
        source, seed=7)
    try:
        assert sorted(gens.replica_hosts()) == ["cpu[0]", "cpu[1]"]
        for version in (1, 2, 3):
            trainer.train_step(BATCH)
            trainer.push_weights(version)
            assert await gens.update_weights.fanout(version) == [version, version]
            assert await gens.weight_transport.fanout() == [transport, transport]  # each host pulled it this way
            rings = host_rings(tmp_path / "hosts")
            assert len(rings) == 2 and all(version in v for v in rings.values()), rings  # one copy per host
            trainer.model.eval()
            for completion in await gens.generate.fanout(PROMPT, 6):
                assert completion.policy_version == version
                expected = trainer.logprobs([sample(PROMPT, completion.token_ids)])[0][len(PROMPT):]
                assert torch.allclose(torch.tensor(completion.logprobs), torch.tensor(expected), atol=1e-5)
            trainer.model.train()
        # A host that lost its copy (a machine replaced) pulls the version it is asked for again.
        lost = sorted((tmp_path / "hosts").iterdir())[0]
        shutil.rmtree(lost)
        trainer.train_step(BATCH)
        trainer.push_weights(4)
        assert await gens.update_weights.fanout(4) == [4, 4]
        assert all(v == [4] or v == [3, 4] for v in host_rings(tmp_path / "hosts").values())
        assert host_rings(tmp_path / "hosts")[lost.name] == [4]
    finally:
        await gens.shutdown()
        await procs.stop()
        store.clear()


INNER = "FORGE_TEST_RELAY_REVIVE_INNER"


async def test_a_host_killed_and_revived_catches_up_to_the_latest_version(jobs, tmp_path):  # noqa: F811
    """Runs in a pytest process of its own: after this scenario (a host killed under a generator service),
    the next test in the same process that used Monarch crashed (segfault or silent exit 1) in about half
    the runs here, while the scenario itself always passed. Not understood; isolated so it cannot take the
    rest of the suite down. Later (after the relay moved to RDMA buffers) it did not recur in six runs with
    this scenario and the next tests in one process (the training-app test, as when it was seen, or the
    resume tests). A likely path for the silent exit 1: Monarch notices the killed host's meshes only at
    its supervision poll (every 10 s), so their failures can arrive during the next test, and one that
    reaches the root client unhandled ends the process (``monarch.actor.unhandled_fault_hook``: exit 1)."""
    if os.environ.get(INNER) != "1":
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"{__file__}::test_a_host_killed_and_revived_catches_up_to_the_latest_version",
            env={**os.environ, INNER: "1"}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        assert proc.returncode == 0 and b"1 passed" in out, out.decode(errors="replace")[-4000:]
        return
    job, mesh = start_job(2, jobs)
    group = placement.register_hosts("cpu", mesh)
    store = WeightStore("relay-revive", backend="ring", root=tmp_path / "trainer")
    trainer = TorchTrainer(tiny_model(seed=0), device="cpu", loss="sft", lr=2e-2, weight_store=store)
    server, procs = await spawn_weight_server(store)
    source = RemoteWeightSource(server, "relay-revive", host_key=host_key_session, root_base=str(tmp_path / "hosts"))
    gens = await TinyPolicyGenerator.options(num_replicas=2, hosts="cpu", replicas_per_host=1,
                                             spawn_timeout_s=20.0).as_service(source, seed=7)
    try:
        trainer.train_step(BATCH)
        trainer.push_weights(1)
        assert await gens.update_weights.fanout(1) == [1, 1]
        kill_host(job, "cpu_0")
        await wait_until(lambda: not group.hosts[0].alive, timeout=120)
        for version in (2, 3):  # pushed while the host is down: only the live host follows
            trainer.train_step(BATCH)
            trainer.push_weights(version)
            results = await gens.update_weights.fanout(version)
            assert version in results
        replacement, new_mesh = start_job(1, jobs)
        group.revive(0, new_mesh)
        await wait_until(lambda: gens.metrics().healthy_replicas == 2, timeout=120)
        before = set(host_rings(tmp_path / "hosts"))
        assert await gens.update_weights.fanout(3) == [3, 3]  # the revived host pulls the latest version
        new = set(host_rings(tmp_path / "hosts")) - before
        assert len(new) == 1 and host_rings(tmp_path / "hosts")[new.pop()] == [3]  # and none it missed
        trainer.model.eval()
        for completion in await gens.generate.fanout(PROMPT, 6):
            expected = trainer.logprobs([sample(PROMPT, completion.token_ids)])[0][len(PROMPT):]
            assert completion.policy_version == 3
            assert torch.allclose(torch.tensor(completion.logprobs), torch.tensor(expected), atol=1e-5)
    finally:
        await gens.shutdown()
        await procs.stop()
        store.clear()


async def _train_two_steps(tmp_path, *extra):
    from agents.train.loop import train
    from agents.train.metrics import read_metrics
    from tests.test_train_loop import small_config

    config = small_config(tmp_path, "loop.mode=sync", "loop.steps=2", "generator.service=true",
                          "eval.num_tasks=0", *extra)
    result = await train(config)
    records = [r for r in read_metrics(result.output_dir / "metrics.jsonl") if r["kind"] == "train"]
    return config, result, records


async def test_the_training_app_learns_the_same_with_its_generator_on_a_job_host(tmp_path):
    spec = tmp_path / "job.py"
    spec.write_text("from monarch.job import ProcessJob\njob = ProcessJob({'gpu': 1})\n")
    remote_config, remote, remote_records = await _train_two_steps(
        tmp_path / "remote", f"job={spec}", "generator.hosts=gpu")
    assert remote_config.generator.resolved_weight_transport() == "monarch"
    _, local, local_records = await _train_two_steps(tmp_path / "local")
    assert remote.state.policy_version == local.state.policy_version == 2
    assert [r["policy_version"] for r in remote_records] == [1.0, 2.0]
    for key in ("loss", "rollout/reward_mean", "grad_norm"):
        got, want = [r[key] for r in remote_records], [r[key] for r in local_records]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), key
    assert placement.host_groups() == {}


def test_the_weight_transport_follows_placement_and_can_be_forced():
    from agents.train.config import ConfigError, GeneratorConfig, load_grpo_config

    assert GeneratorConfig().resolved_weight_transport() == "ring"
    assert GeneratorConfig(hosts="gpu").resolved_weight_transport() == "monarch"
    assert GeneratorConfig(hosts="gpu", weight_transport="shm").resolved_weight_transport() == "shm"
    with pytest.raises(ValueError, match="weight_transport must be"):
        GeneratorConfig(weight_transport="nfs")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="weight_transport=monarch needs generator.service"):
        load_grpo_config(None, ["generator.weight_transport=monarch", "generator.service=false"]).validate()


class _DroppingSource(RemoteWeightSource):
    """Records the chunk offsets that land; its first pull drops after ``drop_after`` chunks landed."""

    def __init__(self, *args, drop_after, **kwargs):
        super().__init__(*args, **kwargs)
        self.drop_after, self.asked = drop_after, []

    def _receive(self, desc, view, start, follow=None):
        for n, (offset, length) in enumerate(super()._receive(desc, view, start, follow)):
            self.asked.append(offset)
            if self.drop_after is not None and n == self.drop_after:
                self.drop_after = None
                raise ConnectionError("the link dropped")
            yield offset, length



@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_pull_cut_off_half_way_resumes_where_it_stopped(tmp_path, transport):
    store = WeightStore("relay-resume", backend="ring", root=tmp_path / "trainer")
    state = {f"layer{i}": torch.randn(64, 1024) for i in range(4)}  # 1 MiB: 16 chunks of 64 KiB
    store.put(state, 1)
    server, procs = await spawn_weight_server(store)
    source = _DroppingSource(server, "relay-resume", host_key=lambda: "host-a", root_base=str(tmp_path / "hosts"),
                             chunk_bytes=64 << 10, drop_after=5, transport=transport)
    try:
        with pytest.raises(ConnectionError):
            await asyncio.to_thread(source.weights_path, 1)
        assert source.local_store().versions() == []  # nothing readable from a cut-off pull
        assert source.asked == [n * (64 << 10) for n in range(6)]
        source.asked.clear()
        got, version = await source.get(1)
        assert version == 1 and source.last_transport == transport
        assert source.asked[0] == 5 * (64 << 10)  # resumed at the first chunk it lacked
        assert len(source.asked) == 16 - 5
        for name, tensor in state.items():
            assert torch.equal(got[name], tensor), name
        source.local_store().get(1, verify=True)  # the trainer's checksum holds end to end
    finally:
        await procs.stop()
        store.clear()


class _CorruptingSource(RemoteWeightSource):
    """Flips a byte of the third chunk after it lands, on its first pull only (a link that corrupts data)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.corrupt, self.landed = True, []

    def _receive(self, desc, view, start, follow=None):
        for n, (offset, length) in enumerate(super()._receive(desc, view, start, follow)):
            self.landed.append(offset)
            if self.corrupt and n == 2:
                self.corrupt = False
                view[offset + 100] ^= 0xFF
            yield offset, length


async def test_a_chunk_corrupted_in_transit_fails_the_pull_and_the_next_pull_starts_over(tmp_path):
    store = WeightStore("relay-corrupt", backend="ring", root=tmp_path / "trainer")
    state = {f"layer{i}": torch.randn(64, 1024) for i in range(4)}  # 1 MiB: 16 chunks of 64 KiB
    store.put(state, 1)
    server, procs = await spawn_weight_server(store)
    source = _CorruptingSource(server, "relay-corrupt", host_key=lambda: "host-a", root_base=str(tmp_path / "hosts"),
                               chunk_bytes=64 << 10)
    try:
        with pytest.raises(WeightStoreError, match="checksum"):
            await source.get(1)
        assert source.local_store().versions() == []  # the corrupted version was never completed
        source.landed.clear()
        got, version = await source.get(1)
        assert version == 1 and source.landed[0] == 0 and len(source.landed) == 16  # not resumed: all again
        for name, tensor in state.items():
            assert torch.equal(got[name], tensor), name
    finally:
        await procs.stop()
        store.clear()


class _OvertakenSource(RemoteWeightSource):
    """On its first pull, after three chunks landed, another host pulls a newer version from the same
    server, which holds one version only and so lets this one go (dropping its RDMA buffers)."""

    def __init__(self, *args, other, **kwargs):
        super().__init__(*args, **kwargs)
        self.other, self.starts = other, []

    def _receive(self, desc, view, start, follow=None):
        self.starts.append(start)
        for n, (offset, length) in enumerate(super()._receive(desc, view, start, follow)):
            if self.other is not None and n == 2:
                other, self.other = self.other, None
                other._ensure(2)
            yield offset, length


@pytest.mark.skipif("rdma" not in TRANSPORTS, reason="Monarch has no RDMA backend here")
async def test_a_pull_whose_buffers_the_server_dropped_asks_again_and_resumes(tmp_path):
    store = WeightStore("relay-overtaken", backend="ring", root=tmp_path / "trainer")
    states = {v: {f"layer{i}": torch.randn(64, 1024) for i in range(4)} for v in (1, 2)}
    for version, state in states.items():
        store.put(state, version)
    server, procs = await spawn_weight_server(store, hold=1)
    kwargs = dict(root_base=str(tmp_path / "hosts"), chunk_bytes=64 << 10, transport="rdma")
    other = RemoteWeightSource(server, "relay-overtaken", host_key=lambda: "host-b", **kwargs)
    source = _OvertakenSource(server, "relay-overtaken", host_key=lambda: "host-a", other=other, **kwargs)
    try:
        got, version = await source.get(1)
        assert version == 1 and other.local_store().versions() == [2]
        assert len(source.starts) == 2 and source.starts[1] > 0  # asked again, and resumed past the start
        for name, tensor in states[1].items():
            assert torch.equal(got[name], tensor), name
    finally:
        await procs.stop()
        store.clear()
