"""Runs forked ahead of their requests (issue 34): the zygote forks the next run's process as soon as the last
run is cleaned up, and the request only fills its stdin and code and wakes it. It must behave exactly like a
run forked on demand, and a process forked ahead that is gone (killed from the host) or holds the wrong
prelude must cost nothing but a fork on demand.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.sandbox_support import requires_bwrap, small_sandbox


@pytest.fixture
async def sandbox():
    async with small_sandbox() as sb:
        yield sb


pytestmark = requires_bwrap

#: What a run sees of its stdin and its process's surroundings.
PROBE = """
import os, sys
data = sys.stdin.read()
try:
    os.write(0, b'x')
    writable = True
except OSError:
    writable = False
print(repr(data), writable, sorted(os.listdir('.')), sum(e.isdigit() for e in os.listdir('/proc')))
"""




def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


async def forked_ahead(sandbox) -> int:
    """The host pid of the process the worker forked ahead (the server's youngest child besides its zygote)."""
    server = sandbox.worker_pids[-1]
    for _ in range(200):
        found = children(server)
        if len(found) == 2:
            return max(found, key=start_time)
        await asyncio.sleep(0.01)
    raise AssertionError(f"no process forked ahead: the server's children are {children(server)}")


async def test_runs_forked_ahead_see_what_runs_forked_on_demand_see(sandbox):
    results = []
    for stdin, files in ((None, None), ("in", {"a.txt": "1"}), (None, None), ("", None), ("more", {"b": "2"})):
        results.append((await sandbox.run(PROBE, stdin=stdin, files=files)).stdout)
    # The first run forks on demand, the others were forked ahead: the same view (stdin, /dev/null when
    # there is none, its files only, and only the server, the zygote and itself in its PID namespace).
    assert results == ["'' False [] 3\n", "'in' True ['a.txt'] 3\n", "'' False [] 3\n", "'' True [] 3\n",
                       "'more' True ['b'] 3\n"]
    assert sandbox.stats.workers_started == 1 and sandbox.stats.sandbox_errors == 0


async def test_a_process_forked_ahead_that_is_gone_costs_a_fork_on_demand(sandbox):
    assert (await sandbox.run("print(1)")).stdout == "1\n"
    for _ in range(2):
        os.kill(await forked_ahead(sandbox), signal.SIGKILL)  # as the host's OOM killer or an operator could
        result = await sandbox.run("print(6 * 7)")
        assert result.stdout == "42\n" and result.ok, result
    assert sandbox.stats.workers_replaced == 0 and sandbox.stats.sandbox_errors == 0


async def test_a_process_forked_ahead_that_was_stopped_runs(sandbox):
    assert (await sandbox.run("print(1)")).stdout == "1\n"
    os.kill(await forked_ahead(sandbox), signal.SIGSTOP)
    result = await sandbox.run("print(6 * 7)", timeout=2)
    assert result.stdout == "42\n" and result.ok, result


async def test_a_process_forked_ahead_for_another_prelude_is_replaced(sandbox):
    outputs = []
    for prelude in (None, "X = 1", "X = 1", None, "X = 2", "X = 1"):
        code = "import os\nprint(globals().get('X'), sum(e.isdigit() for e in os.listdir('/proc')))"
        outputs.append((await sandbox.run(code, prelude=prelude)).stdout)
    # The one forked for the wrong prelude is killed and reaped before the run: never a fourth process.
    assert outputs == ["None 3\n", "1 3\n", "1 3\n", "None 3\n", "2 3\n", "1 3\n"]
    assert sandbox.stats.sandbox_errors == 0
