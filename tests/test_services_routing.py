"""Routers (forge_env.services.routing) on real ``Replica`` objects, the names ``load_balancing`` accepts, and
the public session API a service offers its verbs and ``RemoteEnv``."""

import asyncio

import pytest

from forge_env.services import (
    FewestSessionsRouter,
    LeastLoadedRouter,
    RoundRobinRouter,
    ServiceOptions,
    SessionLimitError,
    SessionRouter,
)
from forge_env.services.replica import Replica
from forge_env.services.routing import LOAD_BALANCING, routers_for
from forge_env.services.sessions import SessionRecord
from tests.service_actors import Counter, Echo


class Handle:
    """The least a replica needs to count as attached: pids (never called by a router)."""

    pids: list[int] = []


def replicas(loads=(0, 0, 0), sessions=None):
    out = []
    for i, load in enumerate(loads):
        replica = Replica(i, limit=64, max_queue=None)
        replica.attach(Handle())  # healthy, generation 1
        replica.slots.in_use = load
        replica.sessions = (sessions or [0] * len(loads))[i]
        out.append(replica)
    return out


def test_round_robin_takes_each_replica_in_turn():
    router, pool = RoundRobinRouter(), replicas()
    picks = [router.get_replica(pool).index for _ in range(6)]
    assert sorted(picks) == [0, 0, 1, 1, 2, 2]
    assert picks[:3] == picks[3:] and len(set(picks[:3])) == 3
    pool[1].slots.in_use = 100  # round robin ignores load
    assert sorted(router.get_replica(pool).index for _ in range(3)) == [0, 1, 2]


def test_least_loaded_takes_the_emptiest_and_shares_ties():
    router, pool = LeastLoadedRouter(), replicas(loads=(3, 1, 2))
    assert router.get_replica(pool).index == 1
    pool[0].slots.waiters.extend([None] * 5)  # queued calls count as load too
    pool[1].slots.in_use = 4
    assert router.get_replica(pool).index == 2
    idle = replicas()
    assert {router.get_replica(idle).index for _ in range(3)} == {0, 1, 2}  # ties rotate


def test_fewest_sessions_first_then_least_loaded():
    router = FewestSessionsRouter()
    assert router.get_replica(replicas(loads=(0, 9, 0), sessions=[2, 1, 2])).index == 1
    assert router.get_replica(replicas(loads=(5, 1, 3), sessions=[1, 1, 1])).index == 1


def test_routers_refuse_an_empty_list():
    for router in (RoundRobinRouter(), LeastLoadedRouter(), FewestSessionsRouter(), SessionRouter(RoundRobinRouter())):
        with pytest.raises(ValueError, match="no healthy replica"):
            router.get_replica([])


def test_session_router_places_with_its_fallback_and_never_moves_a_session():
    pool = replicas(loads=(5, 0, 5))
    router = SessionRouter(LeastLoadedRouter())
    placed = router.get_replica(pool)
    assert placed.index == 1
    record = SessionRecord("s", placed.index, placed.generation)
    assert router.replica_of(record, pool) is placed
    placed.slots.in_use = 99  # busy: the session still stays
    assert router.replica_of(record, pool) is placed
    placed.fail("killed", "svc")
    assert router.replica_of(record, pool) is None  # dead: the session is lost, not moved
    placed.attach(Handle())
    assert placed.healthy and router.replica_of(record, pool) is None  # respawned: a new incarnation, no state


def test_load_balancing_names_map_to_routers():
    assert set(LOAD_BALANCING) == {"least_loaded", "round_robin"}
    calls, sessions = routers_for("least_loaded")
    assert isinstance(calls, LeastLoadedRouter) and isinstance(sessions.fallback, FewestSessionsRouter)
    calls, sessions = routers_for("round_robin")
    assert isinstance(calls, RoundRobinRouter) and sessions.fallback is calls  # one turn for calls and sessions
    assert routers_for("round_robin")[0] is not calls  # each service keeps its own turn


@pytest.mark.parametrize("name, hint", [("least_load", "did you mean ['least_loaded']"),
                                        ("roundrobin", "did you mean ['round_robin']"),
                                        ("random", "valid: ['least_loaded', 'round_robin']"),
                                        (None, "valid: ['least_loaded', 'round_robin']")])
def test_an_unknown_load_balancing_is_refused_with_close_matches(name, hint):
    with pytest.raises(ValueError, match=r"unknown load_balancing") as refused:
        ServiceOptions(load_balancing=name)
    assert hint in str(refused.value)
    with pytest.raises(ValueError, match=r"unknown load_balancing"):
        Echo.options(load_balancing=name)


@pytest.mark.parametrize("load_balancing", ["least_loaded", "round_robin"])
async def test_a_service_places_sessions_with_the_router_its_option_names(load_balancing):
    options = {"backend": "local", "num_replicas": 3, "load_balancing": load_balancing}
    async with await Echo.options(**options).as_service() as svc:
        first = [await svc.open_session(f"s{i}") for i in range(3)]
        assert sorted(first) == [0, 1, 2]
        await svc.release_session("s1")  # its replica now holds no session
        placed = await svc.open_session("s3")
        if load_balancing == "least_loaded":
            assert placed == first[1]  # the replica with the fewest sessions
        else:
            assert placed == first[0]  # the next in turn, whatever sessions the replicas hold


async def test_the_public_session_api():
    async with await Counter.options(backend="local", num_replicas=2, max_sessions=2).as_service() as svc:
        first = await svc.open_session("a", held=True)
        assert svc.session_replica("a") == first
        assert await svc.open_session("a") == first  # already open: same replica
        assert (await svc.route_call("incr", (), {}, session_id="a"))[1] == 1
        second = await svc.open_session("b")
        assert second != first  # the new session goes to the replica with fewest sessions
        with pytest.raises(SessionLimitError):
            await svc.open_session("c")
        await svc.release_session("a")
        assert svc.session_replica("a") is None and svc.metrics().sessions == 1
        assert len(await svc.fanout_call("incr", (), {})) == 2

        started = asyncio.Event()

        async def forever():
            started.set()
            await asyncio.sleep(3600)

        task = svc.run_in_background(forever())
        await started.wait()
    assert task.cancelled()  # shutdown cancels what the service runs in the background
