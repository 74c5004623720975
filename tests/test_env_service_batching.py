"""EnvService steps on real replicas: batched steps reach their own sessions, in order, each with its own error;
direct calls (a replica's socket beside Monarch) keep Monarch's failure semantics; a lone Monarch call is sent
at once."""

import asyncio
import os
import signal

import pytest

import forge_env
from forge_env import EpisodeEndedError
from forge_env.services import EnvService, EpisodeNotFoundError, ReplicaFailedError, SessionLostError
from forge_env.services.direct_channel import DirectChannel
from forge_env.services.replica import ReplicaDown
from forge_env.tools import format_hermes_call
from tests.service_actors import SlowEcho
from tests.waiting import wait_until

ENV_ID = "tests/Guess-v0"
forge_env.register(ENV_ID, "tests.guess_env:GuessEnv", high=16, max_turns=8)


def shout(text: str) -> str:
    return format_hermes_call("shout", {"text": text})


def messages(envs: EnvService) -> int:
    return sum(r.handle.messages for r in envs.service.replicas)


async def test_concurrent_steps_reach_their_own_sessions_in_order_as_few_messages():
    async with await EnvService.launch(ENV_ID, num_replicas=2, max_episodes_per_replica=32) as envs:
        for replica in envs.service.replicas:  # steps of these local replicas go over their direct channels
            assert replica.handle.channel is not None and "step" in replica.handle.direct
        clients = [envs.env() for _ in range(24)]
        for i, env in enumerate(clients):
            await env.areset(seed=i)
        assert {env.replica for env in clients} == {0, 1}
        before = messages(envs)

        async def three_steps(i, env):  # the 24 sessions step at once, each one step after another
            return [await env.astep(shout(f"s{i}k{k}")) for k in range(3)]

        results = await asyncio.gather(*(three_steps(i, env) for i, env in enumerate(clients)))
        assert messages(envs) - before <= 24  # two replicas, three rounds: a few messages each, not 72
        for i, session_results in enumerate(results):
            for k, (observation, reward, terminated, _, info) in enumerate(session_results):
                assert observation[0]["content"] == f"S{i}K{k}"  # its own session's answer
                assert info["turn"] == k + 1  # the session's steps ran in the order they were made
                assert reward == 0.0 and not terminated
        assert envs.metrics().failures == 0
        await asyncio.gather(*(env.aclose() for env in clients))


async def test_one_failing_step_in_a_batch_fails_only_its_own_session():
    async with await EnvService.launch(ENV_ID, num_replicas=1, max_episodes_per_replica=16) as envs:
        clients = [envs.env() for _ in range(10)]
        for i, env in enumerate(clients):
            await env.areset(seed=i)
        for ended in (clients[2], clients[7]):
            assert (await ended.astep("It is 1"))[2] is True  # the episode is over: another step is an error
        # the replica drops episode 5 behind its client's back (as its idle reaper would)
        assert await envs.service.call_in_session(clients[5].episode_id, "close_episode", (), {}) is True
        before = messages(envs)
        results = await asyncio.gather(*(env.astep(shout(f"e{i}")) for i, env in enumerate(clients)),
                                       return_exceptions=True)
        assert messages(envs) - before <= 2
        for i, result in enumerate(results):
            if i in (2, 7):
                assert isinstance(result, EpisodeEndedError), result
            elif i == 5:
                assert isinstance(result, EpisodeNotFoundError) and "call areset()" in str(result), result
            else:
                assert result[0][0]["content"] == f"E{i}" and result[4]["turn"] == 1
        metrics = envs.metrics()
        assert metrics.failures == 0 and metrics.healthy_replicas == 1  # errors of steps, not of the replica
        await clients[5].areset(seed=5)  # the client recovers by starting over
        assert (await clients[5].astep(shout("again")))[0][0]["content"] == "AGAIN"


async def test_an_expired_session_still_errors_clearly_over_the_direct_channel():
    async with await EnvService.launch(ENV_ID, num_replicas=1, episode_idle_ttl_s=0.2) as envs:
        env = envs.env()
        await env.areset(seed=3)
        await wait_until(lambda: envs.metrics().sessions == 0, timeout=30)
        with pytest.raises(SessionLostError, match="idle"):
            await env.astep("It is 3")
        with pytest.raises(SessionLostError, match="idle"):  # and again: the tombstone stays
            await env.astep("It is 3")


async def test_direct_calls_keep_per_call_errors_and_replica_death_semantics():
    async with await SlowEcho.options(num_replicas=1, direct_calls=True, max_retries=0).as_service() as svc:
        handle = svc.replicas[0].handle
        assert handle.channel is not None and {"square", "nap", "die"} <= handle.direct
        values = [-v if v % 5 == 2 else v for v in range(30)]
        results = await asyncio.gather(*(svc.square.route(v) for v in values), return_exceptions=True)
        for value, result in zip(values, results, strict=True):
            if value < 0:
                assert isinstance(result, ValueError) and str(result) == f"negative: {value}"
            else:
                assert result == value * value
        # a process killed under calls in flight fails each of them (and is respawned)
        [[pid]] = svc.replica_pids()
        naps = [asyncio.ensure_future(svc.nap.route(30)) for _ in range(6)]
        await wait_until(lambda: handle.in_flight == 6, timeout=30)
        os.kill(pid, signal.SIGKILL)
        outcomes = await asyncio.wait_for(asyncio.gather(*naps, return_exceptions=True), 60)
        assert all(isinstance(r, ReplicaFailedError) for r in outcomes), outcomes
        await wait_until(lambda: svc.metrics().healthy_replicas == 1, timeout=60)
        assert svc.replicas[0].handle.channel is not None  # the respawned replica has a channel of its own
        assert await svc.square.route(7) == 49
        # an endpoint raising SystemExit ends its replica, as it fails a Monarch actor
        with pytest.raises(SessionLostError):
            await svc.die.route(session_id="doomed")
        await wait_until(lambda: svc.metrics().respawns == 2 and svc.metrics().healthy_replicas == 1, timeout=60)
        assert await svc.square.route(3) == 9


async def test_the_direct_socket_hangs_up_on_a_caller_without_the_token():
    async with await SlowEcho.options(num_replicas=1, direct_calls=True).as_service() as svc:
        handle = svc.replicas[0].handle
        address, token = await handle.mesh._forge_channel.call_one()
        intruder = await DirectChannel.connect(address, bytes(len(token)))
        with pytest.raises(ReplicaDown, match="closed"):
            await asyncio.wait_for(intruder.call("square", (4,), {}), 30)
        honest = await DirectChannel.connect(address, token)  # the same socket still serves its callers
        assert await honest.call("square", (4,), {}) == 16
        honest.close()
        assert await svc.square.route(5) == 25


async def test_a_lone_monarch_call_is_sent_at_once_and_calls_behind_it_travel_together():
    async with await SlowEcho.options(num_replicas=1).as_service() as svc:  # no direct calls: Monarch messages
        handle = svc.replicas[0].handle
        assert handle.channel is None and "nap" in handle.batched
        before = handle.messages
        first = asyncio.ensure_future(svc.nap.route(0.5))
        await wait_until(lambda: handle.in_flight == 1, timeout=30)
        assert not handle._senders and not handle._gathering  # sent in the caller's task: no sender task
        behind = [asyncio.ensure_future(svc.nap.route(0.01)) for _ in range(5)]
        await asyncio.gather(first, *behind)
        assert handle.messages - before == 2  # the lone call, then the five behind it as one message
