"""The python tool's code cannot end its episode as an infra failure by taking its sandbox worker down.

Before, a cell whose worker died (``killed_reason="sandbox_error"``) raised ``InfraError``: the rollout
drops such an episode instead of scoring it, so code that kills its own worker could cancel an episode it
was about to fail. Now a probe on a fresh worker decides: the probe runs, so the failure is the code's and
the model reads an error; only a sandbox that fails the probe too is the machine's (``InfraError``).
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from forge_env import InfraError
from forge_env.sandbox.repl import PythonREPL
from tests.sandbox_support import BACKENDS, strict_sandbox


@pytest.fixture(params=BACKENDS)
async def sandbox(request):
    sb = strict_sandbox(request.param, max_concurrency=2)
    yield sb
    await sb.close()


async def _kill_session_worker_during(repl: PythonREPL, code: str) -> str:
    running = asyncio.ensure_future(repl.run(code))
    for _ in range(400):
        worker = getattr(repl._session, "_worker", None)
        if worker is not None and worker.pids and not running.done():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # the cell sleeps: it is in flight
    assert not running.done(), "the cell ended before the host could kill its worker"
    os.kill(repl._session._worker.pids[-1], signal.SIGKILL)  # the fork server
    return await running


async def test_a_lost_worker_is_the_codes_failure_when_the_sandbox_still_works(sandbox):
    repl = PythonREPL(sandbox, timeout=10)
    try:
        assert (await repl.run("x = 41\nprint(x + 1)")).strip() == "42"
        text = await _kill_session_worker_during(repl, "import time\ntime.sleep(3)")
        assert "worker was lost" in text and repl.workers_lost == 1
        # The episode goes on: the next cell runs on a fresh interpreter, and says that state is gone.
        after = await repl.run("print('x' in globals())")
        assert "False" in after and "earlier state is gone" in after
    finally:
        await repl.close()


class _BrokenAfterFirst:
    """The real sandbox for the session; every later one-shot run (the probe) fails as a dead sandbox would."""

    def __init__(self, real):
        self.real, self.limits = real, real.limits

    def session(self):
        return self.real.session()

    async def run(self, code, **kwargs):
        from forge_env.sandbox import ExecResult
        return ExecResult(stderr="sandbox error: engine gone", killed_reason="sandbox_error")


async def test_a_lost_worker_is_infra_when_the_probe_fails_too(sandbox):
    repl = PythonREPL(_BrokenAfterFirst(sandbox), timeout=10)
    try:
        await repl.run("pass")
        with pytest.raises(InfraError, match="fails a program that does nothing"):
            await _kill_session_worker_during(repl, "import time\ntime.sleep(3)")
    finally:
        await repl.close()
