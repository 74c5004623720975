"""Output capture while the fork server sleeps until the run ends (issue 34, server/capture.py ``watch``).

The server no longer wakes on every write of a run: it waits for the run's exit and reads its pipes every
``OUTPUT_POLL_S`` (a HumanEval check writes a record per test). Nothing written may be lost or misattributed
because of that: everything a run wrote before it exited, timed out or was killed comes back, a run may
write more than a pipe holds, and a flood past ``max_output_bytes`` is still stopped as ``output_limit``.
On both backends (the server is the same program in a container).
"""

from __future__ import annotations

import pytest

from tests.sandbox_support import BACKENDS, strict_sandbox

LINES = "import sys\nfor i in range({n}):\n    sys.stdout.write('%06d %s\\n' % (i, 'x' * 57))\n"


def expected_lines(n: int) -> str:
    return "".join(f"{i:06d} {'x' * 57}\n" for i in range(n))


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


async def test_output_larger_than_a_pipe_comes_back_whole(backend):
    sandbox = strict_sandbox(backend, max_concurrency=1, max_output_bytes=1 << 20)
    try:
        n = 6000  # 384 KB: six times a pipe's default capacity, written by one process that then exits
        result = await sandbox.run(LINES.format(n=n) + "sys.stderr.write('e' * 100000)\n")
        assert result.ok and not result.truncated, result.stderr[-500:]
        assert result.stdout == expected_lines(n)
        assert result.stderr == "e" * 100000
    finally:
        await sandbox.close()


async def test_everything_written_before_a_timeout_or_crash_comes_back(backend):
    sandbox = strict_sandbox(backend, max_concurrency=1)
    try:
        # A record per test, then a hang: the records so far are what grading needs (checker.py).
        result = await sandbox.run(LINES.format(n=200) + "sys.stdout.flush()\nwhile True: pass\n", timeout=1)
        assert result.killed_reason == "timeout"
        assert result.stdout == expected_lines(200)
        result = await sandbox.run(LINES.format(n=200) + "sys.stdout.flush()\nimport os\nos.kill(os.getpid(), 9)\n")
        assert result.killed_reason == "signal:SIGKILL"
        assert result.stdout == expected_lines(200)
        # Output of a background process that outlives the run's main process is read until it is killed.
        code = ("import os, sys, time\nif os.fork() == 0:\n    os.write(1, b'child\\n')\n    time.sleep(60)\n"
                "time.sleep(0.3)\nprint('parent')\n")
        result = await sandbox.run(code)
        assert sorted(result.stdout.split()) == ["child", "parent"]
    finally:
        await sandbox.close()


@pytest.mark.parametrize("cap", [4096, 65536, 300_000])
async def test_a_flood_past_the_limit_is_stopped(backend, cap):
    sandbox = strict_sandbox(backend, max_concurrency=1, max_output_bytes=cap)
    try:
        result = await sandbox.run("import sys\nwhile True:\n    sys.stdout.write('o' * 1000)\n")
        assert result.killed_reason == "output_limit" and result.truncated
        assert len(result.stdout) == cap and set(result.stdout) == {"o"}
        # Exactly at the limit is not past it; one byte more is.
        result = await sandbox.run(f"import sys\nsys.stdout.write('o' * {cap})\n")
        assert result.ok and not result.truncated and len(result.stdout) == cap
        result = await sandbox.run(f"import sys\nsys.stdout.write('o' * {cap + 1})\n")
        assert result.killed_reason == "output_limit" and result.truncated and len(result.stdout) == cap
        assert (await sandbox.run("print('still serving')")).stdout == "still serving\n"
    finally:
        await sandbox.close()


async def test_a_session_cell_writing_more_than_a_pipe_holds(backend):
    sandbox = strict_sandbox(backend, max_concurrency=1, max_output_bytes=1 << 20)
    try:
        async with sandbox.session() as repl:
            result = await repl.run(LINES.format(n=3000) + "sys.stdout.flush()\n")
            assert result.stdout == expected_lines(3000) and not result.truncated
            assert (await repl.run("print('after')")).stdout == "after\n"  # nothing left over for the next cell
            result = await repl.run("while True:\n    sys.stdout.write('o' * 1000)\n")
            assert result.killed_reason == "output_limit" and len(result.stdout) == 1 << 20
    finally:
        await sandbox.close()
