"""forge-env serve at capacity: more sessions than the common open-file soft limit of 1,024, each stepped.

The server is started with its soft ``RLIMIT_NOFILE`` lowered to 1,024 (the hard limit left as it is), as on
many machines; it must raise the soft limit itself, and hold and serve every session by default.
"""

import asyncio
import json
import resource
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.serve_support import ServerProcess

ARITHMETIC = "forge_env/Arithmetic-v0"
SESSIONS = 1100
COMMON_SOFT_LIMIT = 1024
STEP = {"type": "step", "data": {"content": "", "tool_calls": [
    {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "23+45*2"}'}}]}}


def lower_soft_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (COMMON_SOFT_LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def soft_file_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' in /proc/PID/limits")


@pytest.fixture(scope="module")
def low_limit_server():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < SESSIONS * 2 + 256:
        pytest.skip(f"the hard open-file limit here ({hard}) is too low for {SESSIONS} sessions on both ends")
    # the test's own client sockets need the same headroom: raise this process's soft limit (the test's, not the
    # product's), and give it back afterwards
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = ServerProcess.forge(ARITHMETIC, "--backend", "local", "--replicas", "2", "--kwargs",
                                 '{"max_turns": 1000}', preexec_fn=lower_soft_file_limit)
    yield server
    assert server.stop() == 0
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_server_raises_its_soft_file_limit(low_limit_server):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    soft = soft_file_limit_of(low_limit_server.proc.pid)
    assert soft > COMMON_SOFT_LIMIT
    assert hard == resource.RLIM_INFINITY or soft == hard
    assert f"open-file limit {soft}" in low_limit_server.ready_line
    assert "up to 2048 sessions" in low_limit_server.ready_line  # the default --max-sessions


async def test_more_sessions_than_the_common_file_limit_each_stepped(low_limit_server):
    url = low_limit_server.url.replace("http://", "ws://") + "/ws"
    gate = asyncio.Semaphore(64)

    async def open_session(seed):
        async with gate:
            ws = await connect(url, open_timeout=120, ping_interval=None, proxy=None)
            await ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
            return ws, json.loads(await asyncio.wait_for(ws.recv(), 120))

    opened = await asyncio.gather(*(open_session(i) for i in range(SESSIONS)), return_exceptions=True)
    sockets = [item[0] for item in opened if not isinstance(item, BaseException)]
    try:
        failures = [item for item in opened if isinstance(item, BaseException)]
        assert not failures, f"{len(failures)} of {SESSIONS} connections failed, e.g. {failures[0]!r}"
        assert all(reset["type"] == "observation" for _, reset in opened), [r for _, r in opened][:3]
        stats = httpx.get(low_limit_server.url + "/stats", timeout=60).json()
        assert stats["active_sessions"] == SESSIONS
        assert sum(r["open_episodes"] for r in stats["replicas"]) == SESSIONS

        async def step(ws):
            await ws.send(json.dumps(STEP))
            return json.loads(await asyncio.wait_for(ws.recv(), 300))

        replies = await asyncio.gather(*(step(ws) for ws in sockets))
        assert all(r["type"] == "observation" for r in replies), [r for r in replies if r["type"] != "observation"][:3]
        assert {r["data"]["observation"]["messages"][0]["content"] for r in replies} == {"113"}
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
