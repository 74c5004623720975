"""Weights across hosts over Monarch actor messages: two ProcessJob hosts whose generators can only reach
the trainer's weights through the WeightServer (their source names no file of the trainer's), each host
keeping its own copy; every version arrives, logprobs equal the trainer's, a wiped host catches up."""

import pickle
import shutil

import pytest
import torch

from forge_env.rl.trainer import TorchTrainer
from forge_env.services import placement
from forge_env.weights import WeightStore
from forge_env.weights.relay import RemoteWeightSource, host_key_session, spawn_weight_server
from tests.rl_actors import TinyPolicyGenerator
from tests.rl_support import sample, tiny_model
from tests.test_hosts import jobs, start_job  # noqa: F401  (jobs: the fixture that kills the job afterwards)

pytestmark = pytest.mark.timeout(400)
PROMPT = [5, 17, 42, 9, 100, 7]
BATCH = [sample(PROMPT, [200, 201, 202, 203]), sample([8, 9], [150, 151, 152])]


def host_rings(base):
    """Each host's ring directory -> the versions complete in it."""
    return {d.name: WeightStore(d.name, backend="ring", root=d).versions() for d in sorted(base.iterdir())}


async def test_generators_on_two_hosts_receive_every_version_without_a_shared_file(jobs, tmp_path):  # noqa: F811
    _, mesh = start_job(2, jobs)
    placement.register_hosts("cpu", mesh)
    store = WeightStore("relay", backend="ring", root=tmp_path / "trainer")
    trainer = TorchTrainer(tiny_model(seed=0), device="cpu", loss="sft", lr=2e-2, weight_store=store)
    server = await spawn_weight_server(store)
    source = RemoteWeightSource(server, "relay", host_key=host_key_session, root_base=str(tmp_path / "hosts"),
                                chunk_bytes=64 << 10)
    assert str(store.backend.root).encode() not in pickle.dumps(source)  # the generators cannot name its files
    gens = await TinyPolicyGenerator.options(num_replicas=2, hosts="cpu", replicas_per_host=1).as_service(
        source, seed=7)
    try:
        assert sorted(gens.replica_hosts()) == ["cpu[0]", "cpu[1]"]
        await gens.setup.fanout()
        for version in (1, 2, 3):
            trainer.train_step(BATCH)
            trainer.push_weights(version)
            assert await gens.update_weights.fanout(version) == [version, version]
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
        await server._forge_procs.stop()
        store.clear()
