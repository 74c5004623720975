"""SWE-v0 grading cannot be cancelled by the code under test taking its sandbox worker down: killed once,
the grading run is retried and graded; killed every time, the tests count as failed (reward 0, never an
InfraError). The host kills the grading worker's fork server while the run is in flight (both backends)."""

from __future__ import annotations

import uuid

import pytest

from environments.swe import SWEEnv
from environments.swe.env import swe_image
from forge_env.sandbox import make_sandbox
from tests.sandbox_support import WorkerKiller
from tests.swe_support import FIXED_OPS, SWE_BACKENDS, TEST_SANDBOX, call, mirror_in, play

MARK = f"# grade-me-{uuid.uuid4().hex}"


def GradingWorkerKiller(real, times: int | None) -> WorkerKiller:
    """Kills the worker of the grading runs whose tree carries :data:`MARK` (tests.sandbox_support.WorkerKiller)."""
    return WorkerKiller(real, times, lambda code, kwargs: MARK.encode() in (kwargs.get("stdin") or b""),
                        in_flight_s=0.5)  # the module under test sleeps at import: the run is in flight


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return mirror_in(tmp_path_factory)


@pytest.fixture(params=SWE_BACKENDS)
async def sandbox(request):
    options = ({"isolation": "bwrap", "packages": ("pytest",)} if request.param == "process"
               else {"image": swe_image()})
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
