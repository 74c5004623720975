"""Services on host meshes from a Monarch job: ``ProcessJob`` workers on this machine act as hosts.

Each test module starts one job with real worker processes; a "host" dies the way a machine
does: its worker and every process it started are killed at once.
"""

import asyncio
import os
import signal

import pytest

from forge_env.services import EnvService, SessionLostError, placement
from forge_env.services.options import ServiceOptions
from tests.guess_env import GuessEnv
from tests.test_env_service import ENV_ID, play
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)


def _session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``: a ProcessJob worker and everything it started."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) != sid:
                    continue
                with open(f"/proc/{entry}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def kill_host(job, name: str) -> None:
    """Kill host ``name`` (e.g. ``cpu_0``) of a ProcessJob like a machine dying: its worker and all it started."""
    worker = job._host_to_pid[name].pid
    for pid in _session_pids(worker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_job(hosts: int, jobs: list):
    """A ProcessJob of ``hosts`` worker processes (hosts); returns it and its host mesh."""
    from monarch.job import ProcessJob

    job = ProcessJob({"cpu": hosts})
    mesh = job.state(cached_path=None).cpu
    job.worker_pids = [state.pid for state in job._host_to_pid.values()]
    jobs.append(job)
    return job, mesh


@pytest.fixture
def jobs():
    """Jobs a test starts (``start_job``); all killed afterwards, and no host process may outlive them."""
    started: list = []
    yield started
    placement.clear_host_groups()
    for job in started:
        job.kill()
    left = [p for job in started for worker in job.worker_pids for p in _session_pids(worker)]
    assert not left, f"host processes left behind: {left}"


@pytest.fixture
def job(jobs):
    """Two hosts, registered as the host group "cpu"."""
    job, mesh = start_job(2, jobs)
    placement.register_hosts("cpu", mesh)
    return job


async def test_replicas_spread_over_the_job_hosts_and_play_like_in_process(job):
    with pytest.raises(ValueError, match="needs backend='monarch'"):
        await EnvService.launch(ENV_ID, backend="local", hosts="cpu")
    async with await EnvService.launch(ENV_ID, num_replicas=2, hosts="cpu") as envs:
        hosts = envs.service.replica_hosts()
        assert sorted(hosts) == ["cpu[0]", "cpu[1]"]
        metrics = envs.metrics()
        assert sorted(r.host for r in metrics.replicas) == ["cpu[0]", "cpu[1]"]
        pids = [p for r in metrics.replicas for p in r.pids]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        # each replica process is a child of its host's worker
        workers = {f"cpu[{i}]": job._host_to_pid[f"cpu_{i}"].pid for i in range(2)}
        for replica in metrics.replicas:
            assert os.getsid(replica.pids[0]) == workers[replica.host]
        local = GuessEnv(high=16, max_turns=8)
        remote_envs = [envs.env() for _ in range(4)]
        results = await asyncio.gather(*(play(env, seed) for env, seed in zip(remote_envs, range(4), strict=True)))
        assert results == [await play(local, seed) for seed in range(4)]
        assert {env.replica for env in remote_envs} == {0, 1}
    assert not [p for p in pids if _alive(p)], "replica processes outlived the service"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


async def test_a_dead_host_loses_its_sessions_and_its_replicas_move(job):
    async with await EnvService.launch(ENV_ID, num_replicas=2, hosts="cpu", spawn_timeout_s=20.0) as envs:
        group = placement.host_group("cpu")
        episodes = [envs.env() for _ in range(4)]
        for i, env in enumerate(episodes):
            await env.areset(seed=i)
        victim_host = envs.service.replica_hosts()[episodes[0].replica]
        victim = int(victim_host[len("cpu["):-1])
        on_victim = [e for e in episodes if envs.service.replica_hosts()[e.replica] == victim_host]
        elsewhere = [e for e in episodes if e not in on_victim]
        assert on_victim and elsewhere
        kill_host(job, f"cpu_{victim}")
        for env in on_victim:
            with pytest.raises(SessionLostError):
                await env.astep("It is 3")
        for env in elsewhere:  # the other host's episodes go on
            await env.astep("It is 3")
        # stateless calls retry on the live replica; the lost replica is respawned on the remaining host
        assert await envs.service.stats.route() is not None
        await wait_until(lambda: envs.metrics().healthy_replicas == 2, timeout=120)
        assert envs.service.replica_hosts() == [f"cpu[{1 - victim}]"] * 2
        assert envs.metrics().sessions_lost == len(on_victim)
        assert envs.metrics().respawns == 1
        # a reset after the loss starts a new episode on a live replica
        await on_victim[0].areset(seed=9)
        assert group.hosts[victim].suspect


async def test_a_host_that_comes_back_is_used_again(job, jobs):
    options = dict(num_replicas=2, hosts="cpu", replicas_per_host=1, spawn_timeout_s=8.0)
    async with await EnvService.launch(ENV_ID, **options) as envs:
        group = placement.host_group("cpu")
        kill_host(job, "cpu_0")
        # its replica cannot move (one replica per host): the service runs on the other one meanwhile
        await wait_until(lambda: not group.hosts[0].alive, timeout=120)
        assert envs.metrics().healthy_replicas == 1
        env = envs.env()
        assert (await play(env, 3))[0] == 1.0
        await env.aclose()
        # the host's worker is restarted (here: a fresh job worker) and handed to the group
        replacement, mesh = start_job(1, jobs)
        group.revive(0, mesh)
        await wait_until(lambda: envs.metrics().healthy_replicas == 2, timeout=120)
        assert sorted(envs.service.replica_hosts()) == ["cpu[0]", "cpu[1]"]
        new_worker = replacement.worker_pids[0]
        on_new = [r for r in envs.metrics().replicas if r.host == "cpu[0]"][0]
        assert os.getsid(on_new.pids[0]) == new_worker


async def test_a_replica_that_stops_answering_is_declared_dead_by_the_heartbeat(job):
    # SIGSTOP: the process exists (no pidfd event), but answers nothing, like a host cut off the network
    options = dict(num_replicas=1, hosts="cpu", heartbeat="always", heartbeat_interval_s=0.5,
                   heartbeat_timeout_s=2.0, heartbeat_busy_timeout_s=4.0, spawn_timeout_s=8.0)
    async with await EnvService.launch(ENV_ID, **options) as envs:
        env = envs.env()
        await env.areset(seed=1)
        frozen = envs.metrics().replicas[0].pids[0]
        assert os.getsid(frozen) in job.worker_pids, "the replica runs on the job's host"
        os.kill(frozen, signal.SIGSTOP)
        try:
            await wait_until(lambda: _state(frozen) == "T", timeout=30)
            with pytest.raises(SessionLostError):
                await env.astep("It is 3")
            assert "heartbeat" in envs.metrics().replicas[0].last_failure
            await wait_until(lambda: envs.metrics().healthy_replicas == 1, timeout=120)
            assert envs.metrics().replicas[0].pids[0] != frozen
            assert (await play(envs.env(), 2))[0] == 1.0
        finally:
            os.kill(frozen, signal.SIGKILL)


def test_unknown_host_group_and_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="name a host group"):
        ServiceOptions(hosts=2)
    with pytest.raises(placement.PlacementError, match="no host group 'gpu'.*--job"):
        placement.resolve_hosts("gpu")


def test_load_job_from_a_python_spec(tmp_path):
    spec = tmp_path / "cluster.py"
    spec.write_text("from monarch.job import ProcessJob\njob = ProcessJob({'cpu': 2, 'gpu': 1})\n")
    job = placement.load_job(str(spec))
    assert type(job).__name__ == "ProcessJob" and job._meshes == {"cpu": 2, "gpu": 1}
    (tmp_path / "bad.py").write_text("job = 3\n")
    with pytest.raises(placement.PlacementError, match="not a monarch.job job"):
        placement.load_job(str(tmp_path / "bad.py"))
    with pytest.raises(placement.PlacementError, match="no such file"):
        placement.load_job(str(tmp_path / "missing.py"))


def _process_name(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as file:
        for item in file.read().split(b"\0"):
            if item.startswith(b"HYPERACTOR_PROCESS_NAME="):
                return item.split(b"=", 1)[1].decode()
    return ""


async def test_the_training_app_runs_its_env_replicas_on_a_job_host(tmp_path):
    from agents.train.components import build_components
    from agents.train.loop import GRPOLoop
    from agents.train.metrics import MetricsLogger
    from tests.test_train_loop import small_config

    spec = tmp_path / "job.py"
    spec.write_text("from monarch.job import ProcessJob\njob = ProcessJob({'cpu': 1})\n")
    config = small_config(tmp_path, f"job={spec}", "env.service.hosts=cpu", "loop.steps=1",
                          "generator.service=false", "eval.num_tasks=0")
    components = await build_components(config)
    try:
        service = components.env_factory.__self__.service
        assert service.replica_hosts() == ["cpu[0]"]
        replica_pid = service.metrics().replicas[0].pids[0]
        worker = os.getsid(replica_pid)
        assert worker != os.getsid(0) and _process_name(replica_pid).endswith("@ cpu_0")
        loop = GRPOLoop(config, components, MetricsLogger(tmp_path / "log", tensorboard=False))
        await loop.start()
        await loop.run_sync()
        assert loop.state.step == 1 and service.metrics().requests > 0
    finally:
        await components.close()
    assert not _session_pids(worker), "the job this run applied must be gone with it"
    assert placement.host_groups() == {}


def test_a_host_group_without_a_job_is_a_config_error():
    from agents.train.config import ConfigError, load_grpo_config

    with pytest.raises(ConfigError, match="env.service.hosts=cpu names a host group.*--job"):
        load_grpo_config(None, ["env.service.hosts=cpu"])


async def test_a_plain_actor_runs_on_a_job_host(job):
    from tests.service_actors import Echo

    actor = await Echo.options(hosts="cpu").as_actor("tag")
    try:
        who = await actor.whoami.call_one()
        assert who["pid"] != os.getpid()
        assert os.getsid(who["pid"]) in job.worker_pids
    finally:
        await Echo.shutdown(actor)


async def test_a_busy_replica_is_not_declared_dead_while_its_call_runs(job):
    from tests.service_actors import SyncEcho

    options = dict(num_replicas=1, hosts="cpu", heartbeat="always", heartbeat_interval_s=0.2,
                   heartbeat_timeout_s=0.5, heartbeat_busy_timeout_s=60.0)
    service = await SyncEcho.options(**options).as_service()
    try:
        # pings queue behind the blocking call for 3 s, far past heartbeat_timeout_s
        assert await service.block.route(3.0) == 3.0
        assert await service.add.route(1) == 11
        assert service.metrics().failures == 0
    finally:
        await service.shutdown()
