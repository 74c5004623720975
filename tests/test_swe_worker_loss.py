"""SWE-v0 grading cannot be cancelled by the code under test taking its sandbox worker down: killed once,
the grading run is retried and graded; killed every time, the tests count as failed (reward 0, never an
InfraError). The host kills the grading worker's fork server while the run is in flight (both backends)."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from environments.swe import SWEEnv
from environments.swe.env import swe_image
from forge_env.sandbox import make_sandbox
from tests.swe_support import FIXED_OPS, SWE_BACKENDS, call, make_mirror, play
from tests.test_swe_env import TEST_SANDBOX

MARK = f"# grade-me-{uuid.uuid4().hex}"


class GradingWorkerKiller:
    """The real sandbox, except that the host kills the worker of the first ``times`` grading runs whose
    tree carries :data:`MARK` (None: every one)."""

    def __init__(self, real, times: int | None):
        self.real, self.limits, self.times, self.kills = real, real.limits, times, 0

    async def run(self, code, **kwargs):
        marked = MARK.encode() in (kwargs.get("stdin") or b"")
        if not marked or (self.times is not None and self.kills >= self.times):
            return await self.real.run(code, **kwargs)
        started = self.real.stats.runs
        running = asyncio.ensure_future(self.real.run(code, **kwargs))
        while self.real.stats.runs == started and not running.done():
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.5)  # the module under test sleeps at import: the run is in flight
        assert not running.done(), "the grading run ended before the host could kill its worker"
        os.kill(self.real.worker_pids[-1], signal.SIGKILL)
        self.kills += 1
        return await running

    def session(self):
        return self.real.session()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    repos = tmp_path_factory.mktemp("repos")
    return repos, make_mirror(repos)


@pytest.fixture(params=SWE_BACKENDS)
async def sandbox(request):
    options = {"isolation": "bwrap"} if request.param == "process" else {"image": swe_image()}
    box = make_sandbox(request.param, **(TEST_SANDBOX | {"max_concurrency": 1}), **options)
    yield box
    await box.close()


SLOW_FIX = f"{MARK}\nimport time\ntime.sleep(3)\n{FIXED_OPS}"


async def test_a_grading_worker_killed_once_is_retried_and_graded(mirror, sandbox):
    repos, row = mirror
    killer = GradingWorkerKiller(sandbox, times=1)
    env = SWEEnv([row], repos_dir=repos, sandbox=killer, spare_sessions=0, grading_timeout=60)
    reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=SLOW_FIX))
    assert killer.kills == 1 and reward == 1.0
    assert info["episode_summary"]["grading_retries"] == 1 and info["episode_summary"]["worker_lost"] is False


async def test_code_whose_grading_worker_dies_every_time_is_graded_zero_not_infra(mirror, sandbox):
    repos, row = mirror
    killer = GradingWorkerKiller(sandbox, times=None)
    env = SWEEnv([row], repos_dir=repos, sandbox=killer, spare_sessions=0, grading_timeout=60)
    reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=SLOW_FIX))
    assert killer.kills == 2 and reward == 0.0
    assert info["episode_summary"]["worker_lost"] is True and info["episode_summary"]["fail_to_pass"] == "0/2"
