"""Persistent sandbox sessions (the REPL behind the python tool): state, limits per call, restarts, cleanup."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pytest

from forge_env.sandbox import SandboxBusyError, SandboxClosedError
from tests.sandbox_support import host_processes_matching, requires_bwrap, strict_sandbox, tmp_listing

pytestmark = requires_bwrap


@pytest.fixture
async def sandbox():
    sb = strict_sandbox(max_concurrency=2, max_sessions=2)
    yield sb
    await sb.close()


async def test_state_persists_and_expressions_echo(sandbox):
    async with sandbox.session() as repl:
        assert (await repl.run("import math\nx = 21")).stdout == ""
        assert (await repl.run("x * 2")).stdout == "42\n"
        assert (await repl.run("print(math.pi > 3); None")).stdout == "True\n"
        assert (await repl.run("open('notes.txt', 'w').write('kept')")).stdout == "4\n"
        assert (await repl.run("open('notes.txt').read()")).stdout == "'kept'\n"


async def test_errors_keep_state(sandbox):
    async with sandbox.session() as repl:
        await repl.run("y = 5")
        failed = await repl.run("y / 0")
        assert failed.exit_code == 1 and "ZeroDivisionError" in failed.stderr and '<cell 2>' in failed.stderr
        assert (await repl.run("y")).stdout == "5\n"
        assert (await repl.run("raise SystemExit(3)")).exit_code == 3
        assert (await repl.run("y")).stdout == "5\n"


async def test_stdin_and_files_per_call(sandbox):
    async with sandbox.session() as repl:
        result = await repl.run("name = input(); open('data.txt').read() + name", stdin="bob\n",
                                files={"data.txt": "hi "})
        assert result.stdout == "'hi bob'\n"


async def test_timeout_restarts_the_interpreter(sandbox):
    async with sandbox.session() as repl:
        await repl.run("z = 1")
        stuck = await repl.run("while True: pass", timeout=0.5)
        assert stuck.timed_out and "next call starts a fresh session" in stuck.stderr
        after = await repl.run("z")
        assert after.exit_code == 1 and "NameError" in after.stderr and "restarted" in after.stderr
        assert (await repl.run("1 + 1")).stdout == "2\n"


async def test_limits_apply_per_call():
    async with strict_sandbox(cpu_seconds=1) as sandbox, sandbox.session() as repl:
        assert (await repl.run("x = bytearray(512 * 1024 * 1024)")).killed_reason == "memory"
        assert (await repl.run("print('x' * 10**6)")).killed_reason == "output_limit"
        cpu = sandbox.limits.cpu_seconds
        # Each call gets its own CPU budget: two calls of ~0.6 budget each both finish.
        spin = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {cpu * 0.6}: pass\n'ok'"
        assert (await repl.run(spin, timeout=30)).stdout == "'ok'\n"
        assert (await repl.run(spin, timeout=30)).stdout == "'ok'\n"
        assert (await repl.run("while True: pass", timeout=30)).killed_reason == "cpu"


async def test_os_exit_and_crash_restart(sandbox):
    async with sandbox.session() as repl:
        died = await repl.run("import os; os._exit(4)")
        assert died.exit_code == 4 and "fresh session" in died.stderr
        assert (await repl.run("2 + 2")).stdout == "4\n"
        crash = await repl.run("import ctypes; ctypes.string_at(0)")
        assert crash.killed_reason == "signal:SIGSEGV"
        assert (await repl.run("3 + 3")).stdout == "6\n"


async def test_sessions_are_isolated_from_each_other(sandbox):
    async with sandbox.session() as a, sandbox.session() as b:
        await a.run("secret = 'a-only'\nopen('/tmp/a.txt', 'w').write('a')")
        probe = await b.run("import os\nprint('secret' in globals(), sorted(os.listdir('/tmp')))")
        assert probe.stdout == f"False {tmp_listing('session')}\n"


async def test_session_cap_and_closed_session(sandbox):
    async with sandbox.session(), sandbox.session():
        with pytest.raises(SandboxBusyError, match="max_sessions"):
            await sandbox.session().start()
    closed = sandbox.session()
    await closed.start()
    await closed.close()
    with pytest.raises(SandboxClosedError):
        await closed.run("1")


async def test_a_killed_session_worker_is_replaced(sandbox):
    async with sandbox.session() as repl:
        await repl.run("v = 1")
        os.kill(repl._worker.pids[-1], signal.SIGKILL)
        await asyncio.sleep(0.2)
        result = await repl.run("'v' in globals()")
        assert result.stdout == "False\n" and "replaced" in result.stderr


async def test_closing_a_session_ends_its_processes(sandbox):
    marker = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 1000}9"
    async with sandbox.session() as repl:
        await repl.run(f"import subprocess\np = subprocess.Popen(['sleep', '{marker}'])")
        assert len(host_processes_matching(f"sleep {marker}")) == 1
    assert host_processes_matching(f"sleep {marker}") == []


async def test_session_calls_share_the_concurrency_cap():
    async with strict_sandbox(max_concurrency=1) as sandbox, sandbox.session() as repl:
        await asyncio.gather(repl.run("import time; time.sleep(0.2)"), sandbox.run("import time; time.sleep(0.2)"))
        assert sandbox.stats.peak_running == 1
