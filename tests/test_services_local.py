"""Service semantics on the in-process backend (fast): routing, fanout, sessions, limits, failures, metrics."""

import asyncio

import pytest
from monarch.actor import ActorError

from forge_env.services import (
    NoHealthyReplicaError,
    ReplicaFailedError,
    ReplicaSpawnError,
    ServiceClosedError,
    ServiceOverloadedError,
    SessionLimitError,
    SessionLostError,
)
from tests.service_actors import BrokenSetup, Counter, Echo, FlakySetup, SlowEcho, SyncEcho
from tests.waiting import wait_until


def local(cls, **options):
    return cls.options(backend="local", **options)


async def test_round_robin_visits_replicas_in_turn_and_setup_ran():
    async with await local(Echo, num_replicas=3, load_balancing="round_robin").as_service("t") as svc:
        seen = [await svc.whoami.route() for _ in range(6)]
        assert all(s["ready"] and s["tag"] == "t" for s in seen)
        assert [r.requests for r in svc.metrics().replicas] == [2, 2, 2]


async def test_least_loaded_spreads_concurrent_calls():
    async with await local(SlowEcho, num_replicas=3).as_service() as svc:
        await asyncio.gather(*(svc.nap.route(0.05) for _ in range(9)))
        assert [r.requests for r in svc.metrics().replicas] == [3, 3, 3]


async def test_fanout_reaches_every_replica_in_order():
    async with await local(Echo, num_replicas=3).as_service() as svc:
        await svc.whoami.route()
        results = await svc.whoami.fanout()
        assert len(results) == 3
        assert sorted(r["calls"] for r in results) == [1, 1, 2]  # every replica answered once more
        assert [r.requests for r in svc.metrics().replicas] == [r["calls"] for r in results]  # in replica order
        with pytest.raises(ValueError, match="nope"):
            await svc.fail.fanout("nope")


async def test_fanout_puts_an_error_object_in_a_dead_replicas_slot():
    async with await local(Echo, num_replicas=2, respawn=False).as_service() as svc:
        async with svc.session() as s:
            dead = s.replica
            with pytest.raises(SessionLostError):
                await svc.die.route()
        results = await svc.add.fanout(1, 2)
        assert isinstance(results[dead], ReplicaFailedError) and results[dead].replica == dead
        assert results[1 - dead] == 3


async def test_application_error_propagates_and_replica_stays_healthy():
    async with await local(Echo, num_replicas=1).as_service() as svc:
        with pytest.raises(ValueError, match="bad input"):
            await svc.fail.route("bad input")
        assert await svc.add.route(2, 3) == 5
        m = svc.metrics()
        assert (m.errors, m.failures, m.healthy_replicas, m.requests) == (1, 0, 1, 2)
        assert m.latency_p50_ms is not None


async def test_sessions_stick_and_receive_their_session_id():
    async with await local(Counter, num_replicas=3, session_end_endpoint="end").as_service() as svc:
        async with svc.session() as a, svc.session() as b:
            counts_a = [(await svc.incr.route(session_id=a.id))[1] for _ in range(3)]
            assert counts_a == [1, 2, 3]  # one replica kept the session's count
            assert [(await b.incr.route())[1] for _ in range(2)] == [1, 2]
            assert a.replica != b.replica  # new sessions go to the replica with fewest sessions
            assert svc.metrics().sessions == 2
        assert svc.metrics().sessions == 0
        states = await svc.state.fanout()
        ended = [sid for st in states for sid in st["ended"]]
        assert sorted(ended) == sorted([a.id, b.id])
        assert all(not st["counts"] for st in states)


async def test_route_inside_a_session_block_is_sticky():
    async with await local(Counter, num_replicas=4).as_service() as svc:
        async with svc.session():
            counts = [(await svc.incr.route())[1] for _ in range(5)]
        assert counts == [1, 2, 3, 4, 5]


async def test_explicit_session_ids_are_bounded():
    async with await local(Counter, num_replicas=2, max_sessions=2).as_service() as svc:
        await svc.incr.route(session_id="a")
        await svc.incr.route(session_id="b")
        with pytest.raises(SessionLimitError, match="max_sessions=2"):
            await svc.incr.route(session_id="c")
        await svc.release_session("a")
        assert (await svc.incr.route(session_id="c"))[1] == 1


async def test_idle_sessions_expire_and_then_count_as_lost():
    async with await local(Counter, num_replicas=1, session_ttl_s=0.05, session_end_endpoint="end").as_service() as svc:
        await svc.incr.route(session_id="idle")
        await wait_until(lambda: svc.metrics().sessions == 0)
        with pytest.raises(SessionLostError, match="idle"):
            await svc.incr.route(session_id="idle")
        [state] = await svc.state.fanout()
        assert state["ended"] == ["idle"]


async def test_replica_death_loses_sessions_retries_stateless_calls_and_respawns():
    async with await local(Echo, num_replicas=2).as_service() as svc:
        async with svc.session() as s:
            victim = s.replica
            with pytest.raises(SessionLostError, match="SystemExit"):
                await svc.die.route()
            with pytest.raises(SessionLostError):
                await svc.whoami.route()
        assert [await svc.add.route(1, 1) for _ in range(4)] == [2] * 4
        await wait_until(lambda: svc.metrics().respawns == 1 and svc.metrics().healthy_replicas == 2)
        m = svc.metrics()
        assert m.replicas[victim].generation == 2 and m.replicas[victim].failures == 1
        assert m.sessions_lost >= 1


async def test_stateless_calls_queued_on_a_dying_replica_are_retried():
    # round robin puts half the calls in the dying replica's queue (least-loaded would send them all to the
    # other replica: an in-process call that never waits is over before the next one is routed)
    async with await local(Echo, num_replicas=2, max_concurrent_per_replica=1,
                           load_balancing="round_robin").as_service() as svc:
        dying = asyncio.ensure_future(svc.die.route(0.05, session_id="victim"))
        await asyncio.sleep(0.01)
        stateless = [asyncio.ensure_future(svc.add.route(i, 1)) for i in range(6)]
        with pytest.raises(SessionLostError):
            await dying
        assert await asyncio.gather(*stateless) == [i + 1 for i in range(6)]
        assert svc.metrics().retries >= 1  # some were queued behind the dying call


async def test_stateless_calls_in_flight_on_a_dying_replica_are_retried():
    async with await local(SlowEcho, num_replicas=2).as_service() as svc:
        await svc.pid.route(session_id="victim")
        in_flight = [asyncio.ensure_future(svc.nap.route(0.2)) for _ in range(6)]
        await asyncio.sleep(0.02)
        with pytest.raises(SessionLostError):
            await svc.die.route(session_id="victim")
        assert len(await asyncio.gather(*in_flight)) == 6  # the victim's share was cancelled and retried
        m = svc.metrics()
        assert m.retries == 3 and m.respawns == 1 and m.healthy_replicas == 2


async def test_concurrency_limit_queues_and_bounds_the_queue():
    async with await local(SlowEcho, num_replicas=1, max_concurrent_per_replica=2, max_queue_per_replica=2
                           ).as_service() as svc:
        calls = [asyncio.ensure_future(svc.nap.route(0.1)) for _ in range(4)]
        await asyncio.sleep(0.02)
        m = svc.metrics()
        assert (m.in_flight, m.queue_depth) == (2, 2)
        with pytest.raises(ServiceOverloadedError, match="max_queue_per_replica=2"):
            await svc.nap.route(0.1)
        await asyncio.gather(*calls)
        assert svc.metrics().queue_depth == 0


async def test_no_healthy_replica_error_when_respawn_is_off():
    async with await local(Echo, num_replicas=1, respawn=False, replica_wait_s=0.05).as_service() as svc:
        async with svc.session():
            with pytest.raises(SessionLostError):
                await svc.die.route()
        with pytest.raises(NoHealthyReplicaError, match="no healthy replica"):
            await svc.whoami.route()


async def test_spawn_and_usage_errors_are_specific():
    with pytest.raises(ReplicaSpawnError, match="model file missing"):
        await local(BrokenSetup).as_service()
    with pytest.raises(TypeError, match="unknown service option"):
        Echo.options(num_replica=2)
    with pytest.raises(ValueError, match="num_replicas"):
        Echo.options(num_replicas=0)
    svc = await local(Echo).as_service()
    with pytest.raises(AttributeError, match="no endpoint 'nope'.*whoami"):
        _ = svc.nope
    await svc.shutdown()
    with pytest.raises(ServiceClosedError):
        await svc.whoami.route()


async def test_a_failed_start_stops_the_replicas_that_did_start():
    FlakySetup.built.clear()
    with pytest.raises(ReplicaSpawnError, match="flaky setup"):
        await local(FlakySetup, num_replicas=2).as_service()
    assert len(FlakySetup.built) == 2 and all(actor.cleaned for actor in FlakySetup.built)


async def test_options_return_a_configured_subclass_and_chain():
    configured = Echo.options(num_replicas=3).options(load_balancing="round_robin")
    assert issubclass(configured, Echo) and configured.__name__ == "Echo"
    assert configured._forge_options.num_replicas == 3
    assert configured._forge_options.load_balancing == "round_robin"
    assert Echo._forge_options.num_replicas == 1


async def test_as_actor_local_keeps_monarch_call_verbs():
    actor = await local(SyncEcho).as_actor()
    assert await actor.add.call_one(5) == 15
    assert await actor.add.call(1) == [11]
    echo = await local(Echo).as_actor()
    with pytest.raises(ActorError):
        await echo.fail.call_one("x")
    await Echo.shutdown(echo)
    await SyncEcho.shutdown(actor)
    with pytest.raises(ValueError, match="not made by"):
        await Echo.shutdown(actor)
