"""Services on real Monarch processes: balancing, fanout, stickiness, and killing a replica mid-run."""

import asyncio
import os
import signal

import pytest
import torch
from monarch.actor import ActorError

from forge_env.services import ReplicaSpawnError, SessionLostError
from tests.service_actors import Counter, Echo, GpuProbe, SlowEcho, SyncEcho
from tests.waiting import wait_until


async def test_route_balances_fanout_reaches_all_and_app_errors_stay_app_errors():
    async with await Echo.options(num_replicas=2).as_service("m") as svc:
        pids = [p for [p] in svc.replica_pids()]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        seen = [await svc.whoami.route() for _ in range(6)]
        assert {s["pid"] for s in seen} == set(pids)
        assert all(s["ready"] and s["tag"] == "m" for s in seen)  # setup() ran in each replica
        assert [r["pid"] for r in await svc.whoami.fanout()] == pids  # replica order
        with pytest.raises(ValueError, match="bad input"):
            await svc.fail.route("bad input")
        assert svc.metrics().healthy_replicas == 2 and svc.metrics().failures == 0
        assert await svc.cuda_visible.fanout() == ["", ""]  # CPU-only replicas


async def test_sessions_stick_to_one_replica_process():
    async with await Counter.options(num_replicas=2, session_end_endpoint="end").as_service() as svc:
        async with svc.session() as a, svc.session() as b:
            runs_a = [await svc.incr.route(session_id=a.id) for _ in range(3)]
            runs_b = [await b.incr.route() for _ in range(2)]
        assert len({pid for pid, _ in runs_a}) == 1 and [n for _, n in runs_a] == [1, 2, 3]
        assert [n for _, n in runs_b] == [1, 2] and runs_b[0][0] != runs_a[0][0]
        ended = [sid for state in await svc.state.fanout() for sid in state["ended"]]
        assert a.id in ended


async def test_killed_replica_is_respawned_stateless_calls_succeed_sessions_are_lost():
    async with await SlowEcho.options(num_replicas=2).as_service() as svc:
        victim_pid = await svc.pid.route(session_id="sticky")
        victim = [p for [p] in svc.replica_pids()].index(victim_pid)
        stateless = [asyncio.ensure_future(svc.nap.route(0.5)) for _ in range(8)]
        sticky = asyncio.ensure_future(svc.nap.route(0.5, session_id="sticky"))
        await asyncio.sleep(0.1)
        assert svc.metrics().replicas[victim].in_flight > 1  # stateless calls are in flight on the victim too
        os.kill(victim_pid, signal.SIGKILL)
        with pytest.raises(SessionLostError):
            await sticky
        results = await asyncio.gather(*stateless)
        assert len(results) == 8 and victim_pid not in results
        assert svc.metrics().retries >= 1
        with pytest.raises(SessionLostError):
            await svc.pid.route(session_id="sticky")
        await wait_until(lambda: svc.metrics().respawns == 1 and svc.metrics().healthy_replicas == 2)
        new_pids = {p for [p] in svc.replica_pids()}
        assert victim_pid not in new_pids and len(new_pids) == 2
        assert len({await svc.pid.route() for _ in range(6)}) == 2  # the respawned replica serves again
        assert svc.metrics().replicas[victim].failures == 1


async def test_actor_failure_counts_as_replica_failure():
    async with await Echo.options(num_replicas=1).as_service() as svc:
        [[before]] = svc.replica_pids()
        async with svc.session():
            with pytest.raises(SessionLostError):
                await svc.die.route()
        assert (await svc.whoami.route())["ready"]  # waits for the respawn
        [[after]] = svc.replica_pids()
        assert after != before and svc.metrics().respawns == 1


async def test_as_actor_keeps_monarch_verbs_and_shuts_down():
    actor = await SyncEcho.as_actor()
    assert await actor.add.call_one(5) == 15
    await SyncEcho.shutdown(actor)
    with pytest.raises(ValueError, match="not made by"):
        await SyncEcho.shutdown(actor)


async def test_multi_process_actor_and_gpu_assignment(monkeypatch):
    # The allocator reads CUDA_VISIBLE_DEVICES, so device assignment is checked without a GPU.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7,9")
    pair = await Echo.options(procs=2, with_gpus=True).as_actor()
    answers = [v for _, v in (await pair.whoami.call()).items()]
    assert len({a["pid"] for a in answers}) == 2 and all(a["ready"] for a in answers)
    assert sorted(v for _, v in (await pair.cuda_visible.call()).items()) == ["3", "5"]
    with pytest.raises(ActorError):
        await pair.fail.call("x")
    async with await Echo.options(procs=2, with_gpus=True).as_service() as svc:
        assert await svc.cuda_visible.fanout() == ["7"]  # a multi-process replica answers with rank 0's result
        assert (await svc.whoami.route())["ready"]
        with pytest.raises(ReplicaSpawnError, match="needs 1 GPU"):
            await Echo.options(with_gpus=True).as_service()
    await Echo.shutdown(pair)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
async def test_gpu_replica_sees_its_gpu():
    async with await GpuProbe.options(with_gpus=True).as_service() as svc:
        [name] = await svc.device_name.fanout()
        assert name == torch.cuda.get_device_name(0)


async def test_concurrent_calls_travel_together_and_keep_their_own_results_and_errors():
    async with await SlowEcho.options(num_replicas=1).as_service() as svc:
        handle = svc.replicas[0].handle
        assert "square" in handle.batched and "pid" in handle.batched
        before = handle.messages
        values = [-v if v % 7 == 3 else v for v in range(40)]
        results = await asyncio.gather(*(svc.square.route(v) for v in values), return_exceptions=True)
        assert handle.messages - before < len(values)  # calls made in one turn went as few messages
        for value, result in zip(values, results, strict=True):
            if value < 0:
                assert isinstance(result, ValueError) and str(result) == f"negative: {value}"
            else:
                assert result == value * value
        before = handle.messages
        assert await svc.square.route(12) == 144  # a call alone goes alone
        assert handle.messages - before == 1
        assert svc.metrics().failures == 0

    async with await SlowEcho.options(num_replicas=1, batch_calls=False).as_service() as svc:
        handle = svc.replicas[0].handle
        assert not handle.batched
        before = handle.messages
        assert await asyncio.gather(*(svc.square.route(v) for v in range(10))) == [v * v for v in range(10)]
        assert handle.messages - before == 10


async def test_a_replica_killed_under_a_batch_fails_every_call_of_it():
    async with await SlowEcho.options(num_replicas=1, respawn=False, max_retries=0).as_service() as svc:
        [pid] = svc.replica_pids()[0]
        naps = [asyncio.ensure_future(svc.nap.route(30)) for _ in range(8)]
        await wait_until(lambda: svc.replicas[0].handle.in_flight == 8, timeout=30)
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*naps, return_exceptions=True), 60)
        assert all(type(r).__name__ == "ReplicaFailedError" for r in results), results
