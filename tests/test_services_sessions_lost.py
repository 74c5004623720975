"""A lost session counts once in ``sessions_lost``, on both backends, even with calls in flight when it is lost."""

import asyncio
import os
import signal

import pytest

from forge_env.services import ReplicaFailedError, SessionLostError
from tests.service_actors import SlowEcho


async def _kill_the_replica(svc, backend):
    if backend == "monarch":
        os.kill(await svc.pid.route(), signal.SIGKILL)  # a real process dies
    else:
        with pytest.raises(ReplicaFailedError):  # the in-process replica's actor raises SystemExit
            await svc.die.route()


@pytest.mark.parametrize("backend", ["local", "monarch"])
async def test_each_lost_in_flight_session_counts_once(backend):
    options = {"backend": "local"} if backend == "local" else {}
    async with await SlowEcho.options(num_replicas=1, **options).as_service() as svc:
        in_flight = [asyncio.ensure_future(svc.nap.route(5.0, session_id=sid)) for sid in ("a", "b")]
        await asyncio.sleep(0.3)
        await _kill_the_replica(svc, backend)
        for call in in_flight:
            with pytest.raises(SessionLostError):
                await call
        assert svc.metrics().sessions_lost == 2
