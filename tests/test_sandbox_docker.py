"""The docker backend (gated: needs a running Docker engine and the image already present locally)."""

from __future__ import annotations

import pytest

from forge_env.sandbox import SandboxUnavailableError, make_sandbox
from forge_env.sandbox.docker import DEFAULT_IMAGE, LABEL


def _engine():
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get(DEFAULT_IMAGE)
        return client
    except Exception:
        return None


ENGINE = _engine()
pytestmark = pytest.mark.docker
needs_engine = pytest.mark.skipif(ENGINE is None, reason=f"no Docker engine with {DEFAULT_IMAGE} available")


@pytest.mark.skipif(ENGINE is not None, reason="an engine is available")
def test_without_an_engine_the_error_says_what_to_do():
    with pytest.raises(SandboxUnavailableError, match="(?i)docker"):
        make_sandbox("docker")


@needs_engine
async def test_docker_runs_limits_and_cleans_up():
    sandbox = make_sandbox("docker", max_concurrency=2, cpu_seconds=2, wall_timeout_s=5, memory_mb=256,
                           max_processes=16, max_output_bytes=4096)
    label = sandbox.label
    try:
        hello = await sandbox.run("import os; print('hi', os.getuid() != 0)")
        assert hello.stdout == "hi True\n"
        assert (await sandbox.run("import time; time.sleep(30)", timeout=0.5)).timed_out
        assert (await sandbox.run("x = bytearray(1024**3)")).killed_reason == "memory"
        assert (await sandbox.run("while True: print('x' * 100)")).killed_reason == "output_limit"
        net = await sandbox.run("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
                                "    print('CONNECTED')\nexcept OSError:\n    print('refused')")
        assert net.stdout == "refused\n"
        bomb = await sandbox.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                                 timeout=1)
        assert bomb.killed_reason in ("timeout", "cpu")
        async with sandbox.session() as repl:
            await repl.run("x = 2")
            assert (await repl.run("x * 21")).stdout == "42\n"
        assert (await sandbox.run("print('still serving')")).ok
    finally:
        await sandbox.close()
    assert ENGINE.containers.list(all=True, filters={"label": f"{LABEL}={label}"}) == []
