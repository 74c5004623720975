"""A program that used an ``EnvService`` on the Monarch backend and lost a replica exits with its own status,
whether it shut the service down or not, on a loaded machine too (issue 47, item 7).

Reported: such a script aborted at interpreter exit (``FATAL: exception not rethrown``, SIGABRT, exit -6) at
load ~7 after its checks had passed. Seen here under load: Monarch's own exit hook gives the client's shutdown
1 s, runs out (``TimeoutError`` in an atexit callback, exit status 1) and leaves Monarch's threads running into
the interpreter's finalization. ``forge_env.services.monarch_backend.shut_down_at_exit`` now runs first.
Each case runs the script in a subprocess while two busy processes load the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import asyncio, os, signal, sys, time

    from forge_env.services import EnvService, SessionLostError

    MODE = sys.argv[1]

    if MODE == "slow_shutdown":
        # A machine so loaded that shutting Monarch's client down takes 1.5 s (Monarch's exit hook allows 1 s):
        # the call that starts the shutdown answers 1.5 s late; later calls (already claimed) at once.
        import monarch.actor
        from monarch._src.actor import actor_mesh

        real = actor_mesh.shutdown_context
        started = []

        class Late:
            def __init__(self, future, delay):
                self.future, self.delay = future, delay

            def get(self, timeout=None):
                time.sleep(min(self.delay, timeout if timeout is not None else self.delay))
                if timeout is not None and timeout < self.delay:
                    raise TimeoutError("the shutdown did not finish in time (simulated load)")
                return self.future.get(None if timeout is None else timeout - self.delay)

        def slow(host_timeout=None):
            delay = 0.0 if started else 1.5
            started.append(host_timeout)
            return Late(real(host_timeout=host_timeout), delay)

        actor_mesh.shutdown_context = monarch.actor.shutdown_context = slow

    async def main():
        # resume_sessions=False: the sessions on the killed replica are lost for good (what this exit path is
        # about); with durable sessions they would resume elsewhere (tests/test_durable_sessions.py).
        envs = await EnvService.launch("forge_env/Arithmetic-v0", num_replicas=2, backend="monarch",
                                       resume_sessions=False)
        episodes = [envs.env() for _ in range(4)]
        for i, env in enumerate(episodes):
            await env.areset(seed=i)
        stats = await envs.replica_stats()
        os.kill(stats[episodes[0].replica]["pid"], signal.SIGKILL)
        outcomes = []
        for env in episodes:
            try:
                await env.astep("42")
                outcomes.append("ok")
            except SessionLostError:
                outcomes.append("lost")
        assert sorted(outcomes) == ["lost", "lost", "ok", "ok"], outcomes
        for env in episodes:  # the lost ones start over on the replica left
            await env.areset(seed=9)
            await env.astep("1")
        if MODE == "shutdown":
            await envs.shutdown()
        print("checks passed", flush=True)  # "leak", "slow_shutdown": exit with the service still up

    asyncio.run(main())
''')


@pytest.fixture
def loaded_machine():
    """Two busy processes for the length of the test (stopped by their own handles)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for process in busy:
            process.kill()
            process.wait()


@pytest.mark.parametrize("mode", ["shutdown", "leak", "slow_shutdown"])
def test_a_script_that_lost_a_replica_exits_cleanly(mode, tmp_path, loaded_machine):
    script = tmp_path / "lost_replica.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, str(script), mode], cwd=ROOT, capture_output=True, text=True,
                            timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    tail = f"exit {result.returncode}\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-4000:]}"
    assert "checks passed" in result.stdout, tail
    assert result.returncode == 0, tail
    assert "FATAL" not in result.stderr and "Exception ignored in atexit" not in result.stderr, tail
