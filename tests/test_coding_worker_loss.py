"""Graded code cannot cancel its own grade by taking its sandbox worker down (issue 29, item 2).

The worker is killed from the host (SIGKILL to its fork server) while it runs a grading run, on both
backends. Killed once, the run is retried on another worker and graded as usual; killed on every try, the
failure follows the code: it is graded 0 and says so in ``info``, instead of ending the episode as an
``InfraError`` that training would drop (which is what every such run did before).
"""

from __future__ import annotations

import uuid

import pytest

from environments.coding import CodingEnv, load_bundled
from tests.sandbox_support import BACKENDS, strict_sandbox
from tests.sandbox_support import WorkerKiller as SandboxWorkerKiller

TASKS = {task["task_id"]: task for task in load_bundled()}
CALLS_ONLY = TASKS["forge/asserts/0"]  # reverse_words: every test one call, compared on the host
JUDGED = {"task_id": "looped", "prompt": "Write digit_sum(n), the sum of the digits of |n|.",
          "tests": ["for n, s in [(1234, 10), (-99, 18)]:\n    assert digit_sum(n) == s", "assert digit_sum(0) + 0 == 0",
                    "assert digit_sum(7) == 7"],
          "solution": "def digit_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n"}
#: Grading runs of code carrying this mark are the ones the host kills.
MARK = f"# grade-me-{uuid.uuid4().hex}"


def WorkerKiller(real, times: int | None) -> SandboxWorkerKiller:
    """Kills the worker of the grading runs of code carrying :data:`MARK` (tests.sandbox_support.WorkerKiller)."""
    return SandboxWorkerKiller(real, times, lambda code, kwargs: MARK in code or MARK in str(kwargs.get("stdin") or ""))


def marked_solution(task: dict) -> str:
    return f"{MARK}\nimport time\ntime.sleep(1.5)\n{task['solution']}"


@pytest.fixture(params=BACKENDS)
async def sandbox(request):
    sb = strict_sandbox(request.param, max_concurrency=1)
    yield sb
    await sb.close()


@pytest.mark.parametrize("task", [CALLS_ONLY, JUDGED], ids=["calls-only", "judge"])
async def test_a_worker_killed_once_is_retried_and_the_code_graded(sandbox, task):
    killer = WorkerKiller(sandbox, times=1)
    env = CodingEnv(tasks=[task], sandbox=killer, max_attempts=1)
    await env.areset(options={"task": task})
    _, reward, terminated, _, info = await env.astep(f"```python\n{marked_solution(task)}\n```")
    assert killer.kills == 1 and sandbox.stats.sandbox_errors == 1
    assert terminated and reward == 1.0, info
    assert info["metrics"]["grading_retries"] == 1.0 and info["metrics"]["worker_lost"] == 0.0


@pytest.mark.parametrize("task", [CALLS_ONLY, JUDGED], ids=["calls-only", "judge"])
async def test_code_whose_worker_dies_every_time_is_graded_zero_not_infra(sandbox, task):
    killer = WorkerKiller(sandbox, times=None)
    env = CodingEnv(tasks=[task], sandbox=killer, max_attempts=2)
    await env.areset(options={"task": task})
    feedback, reward, terminated, _, info = await env.astep(f"```python\n{marked_solution(task)}\n```")
    # The graded run and the run of the visible tests for feedback: each killed, retried and killed, then
    # a probe that does nothing, which the sandbox runs fine.
    assert killer.kills == 4 and killer.runs == 6 and sandbox.stats.sandbox_errors == 4
    assert not terminated and reward == 0.0
    assert info["metrics"]["worker_lost"] == 1.0 and info["metrics"]["pass_rate"] == 0.0
    assert "brought its sandbox worker down, twice" in feedback[0]["content"]
    _, reward, terminated, _, info = await env.astep(env.expert_action())  # the env keeps serving
    assert terminated and reward == 0.5 and info["metrics"]["worker_lost"] == 0.0
