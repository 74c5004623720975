"""Hostile programs on both sandbox backends: each one is contained, and the sandbox keeps serving after it.

Every test runs on ``process`` (bubblewrap) and on ``docker`` (a real engine; skipped with the reason where
none can run). The expectations are the same on both, except where the backends differ by design:

- /tmp listings: bubblewrap binds the interpreter's directories that live under the host's /tmp into the
  sandbox's /tmp (read-only, never wiped); a container's interpreter is the image's, so /tmp holds only
  what runs put there (``tmp_listing(backend=...)``).
- Whole-run limits beyond the per-process rlimits (memory of all processes together, their number as a
  cgroup) come from the container on ``docker`` and are tested in tests/test_sandbox_docker.py.
"""

from __future__ import annotations

import os
import socket
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.sandbox_support import (
    BACKENDS,
    KEPT_UNDER_TMP,
    host_processes_matching,
    strict_sandbox,
    tmp_listing,
)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
async def sandbox(backend):
    # One worker, so every test also shows the next run on the same worker is unaffected.
    sb = strict_sandbox(backend, max_concurrency=1)
    yield sb
    assert (await sb.run("print('still serving')")).stdout == "still serving\n"
    assert sb.stats.workers_replaced == 0  # nothing the code did could take its worker down
    await sb.close()


async def count_processes(sandbox) -> int:
    result = await sandbox.run("import os; print(sum(e.isdigit() for e in os.listdir('/proc')))")
    return int(result.stdout)


async def test_fork_bomb_is_bounded_and_cleaned_up(sandbox):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = await sandbox.run(code, timeout=1.5)
    assert result.killed_reason in ("timeout", "cpu")
    assert await count_processes(sandbox) == 3  # the server, its zygote and the counting run: the bomb is gone


async def test_memory_hog(sandbox):
    result = await sandbox.run("hog = []\nwhile True:\n    hog.append(' ' * 10_000_000)\n")
    assert result.killed_reason == "memory"


async def test_infinite_loop_and_sleep(sandbox):
    assert (await sandbox.run("while True: pass", timeout=1)).killed_reason == "timeout"
    assert (await sandbox.run("import time; time.sleep(1000)", timeout=0.5)).timed_out


async def test_output_flood_on_both_streams(sandbox):
    result = await sandbox.run("import sys\nwhile True:\n    sys.stdout.write('o' * 4096)\n    sys.stderr.write('e' * 4096)\n")
    assert result.killed_reason == "output_limit"
    cap = sandbox.limits.max_output_bytes
    assert len(result.stdout.encode()) <= cap and len(result.stderr.encode()) <= cap


async def test_writing_outside_its_directory_fails(sandbox):
    code = textwrap.dedent("""
        import os
        for path in ['/usr/evil', '/etc/evil', '/evil', '/root/evil', '/proc/evil', '/dev/evil', '/bin/evil']:
            try:
                open(path, 'w').write('x')
                print('WROTE', path)
            except OSError as exc:
                print('refused', path, type(exc).__name__)
        open('/tmp/private', 'w').write('x')  # allowed: the run's own private /tmp
    """)
    result = await sandbox.run(code)
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout and result.stdout.count("refused") == 7
    assert not Path("/tmp/private").exists() or Path("/tmp/private").read_text() != "x"


async def test_host_secrets_are_not_readable(sandbox, monkeypatch):
    secret = uuid.uuid4().hex
    host_files = [Path("/tmp") / f"forge-secret-{secret}", Path.home() / f".forge-secret-{secret}"]
    for path in host_files:
        path.write_text(secret)
    monkeypatch.setenv("FORGE_TEST_SECRET", secret)
    try:
        code = textwrap.dedent(f"""
            import os
            for path in {[str(p) for p in host_files]!r} + ['/proc/1/environ', '/etc/shadow', '/root/.bashrc']:
                try:
                    print(open(path).read())
                except OSError as exc:
                    print('refused', type(exc).__name__)
            print(dict(os.environ))
            for root, dirs, files in os.walk('/tmp'):
                dirs[:] = [d for d in dirs if os.path.join(root, d) not in {list(KEPT_UNDER_TMP)!r}]
                print(root, files)
        """)
        result = await sandbox.run(code)
        assert result.ok, result.stderr
        assert secret not in result.stdout
        assert result.stdout.count("refused") == 5
    finally:
        for path in host_files:
            path.unlink()


async def test_no_network(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        code = textwrap.dedent(f"""
            import socket
            for address in [('127.0.0.1', {port}), ('8.8.8.8', 53), ('1.1.1.1', 443)]:
                try:
                    socket.create_connection(address, timeout=2)
                    print('CONNECTED', address)
                except OSError as exc:
                    print('refused', type(exc).__name__)
            try:
                socket.getaddrinfo('pypi.org', 443)
                print('RESOLVED')
            except OSError:
                print('refused dns')
        """)
        result = await sandbox.run(code)
        assert result.ok, result.stderr
        assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
        assert result.stdout.count("refused") == 4
    finally:
        listener.close()


async def test_killing_the_parent_and_everything_else(sandbox):
    code = textwrap.dedent(f"""
        import os, signal
        for pid in (os.getppid(), 1, {os.getpid()}, {os.getppid()}):
            for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        try:
            os.kill(-1, signal.SIGKILL)  # everything it may signal: nothing but itself is left to hit
        except ProcessLookupError:
            pass
        print('alive')
    """)
    result = await sandbox.run(code)
    assert result.stdout == "alive\n"


async def test_the_server_is_out_of_reach(sandbox):
    code = textwrap.dedent("""
        for path in ['/proc/1/fd/1', '/proc/1/mem', '/proc/1/environ']:
            try:
                open(path, 'rb').read(1)
                print('OPENED', path)
            except OSError as exc:
                print('refused', type(exc).__name__)
    """)
    result = await sandbox.run(code)
    assert "OPENED" not in result.stdout and result.stdout.count("refused") == 3


async def test_background_processes_do_not_outlive_the_run(sandbox):
    marker = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 1000}3"
    code = textwrap.dedent(f"""
        import os, subprocess
        subprocess.Popen(['sleep', '{marker}'], start_new_session=True)
        if os.fork() == 0:  # a double fork that detaches
            os.setsid()
            if os.fork() == 0:
                os.execv('/bin/sleep', ['sleep', '{marker}'])
            os._exit(0)
        print('spawned')
    """)
    result = await sandbox.run(code)
    assert result.stdout == "spawned\n", result.stderr
    assert host_processes_matching(f"sleep {marker}") == []
    assert await count_processes(sandbox) == 3  # the server, its zygote and the counting run


async def test_environment_is_scrubbed(sandbox, monkeypatch):
    monkeypatch.setenv("FORGE_TEST_TOKEN", "hunter2")
    result = await sandbox.run("import os; print(sorted(os.environ))")
    assert "FORGE_TEST_TOKEN" not in result.stdout and "hunter2" not in result.stdout


async def test_os_exit_segfault_recursion_syntax_and_bad_utf8(sandbox):
    assert (await sandbox.run("import os; os._exit(9)")).exit_code == 9
    crash = await sandbox.run("import ctypes; ctypes.string_at(0)")
    assert crash.exit_code == -11 and crash.killed_reason == "signal:SIGSEGV"
    recursion = await sandbox.run("def f(n): return f(n + 1)\nf(0)")
    assert recursion.exit_code == 1 and "RecursionError" in recursion.stderr
    deep = await sandbox.run("import sys\nsys.setrecursionlimit(10**8)\ndef f(n): return f(n + 1)\nf(0)", timeout=1)
    assert deep.killed_reason in ("timeout", "memory", "signal:SIGSEGV")
    syntax = await sandbox.run("print('unclosed'")
    assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr
    binary = await sandbox.run("import sys; sys.stdout.buffer.write(b'\\xff\\xfeok'); print('\\udcff')")
    assert binary.ok and binary.stdout.startswith("\ufffd\ufffdok")


async def test_huge_file_write(sandbox):
    result = await sandbox.run("with open('huge', 'wb') as f:\n    while True:\n        f.write(b'0' * 2**20)\n")
    assert result.exit_code == 1 and "File too large" in result.stderr


async def test_runs_cannot_read_each_others_files(backend):
    async with strict_sandbox(backend, max_concurrency=2, wall_timeout_s=10) as sandbox:
        secret = uuid.uuid4().hex
        # each prints when it did its part, so the test knows the reader looked while the secret existed
        writer = sandbox.run(f"import time\nopen('secret.txt', 'w').write('{secret}')\n"
                             f"open('/tmp/secret.txt', 'w').write('{secret}')\n"
                             f"open('/dev/shm/secret.txt', 'w').write('{secret}')\n"
                             "print(time.time())\ntime.sleep(4)\nprint(time.time())")
        # The reader scans again and again for 3.5 s (not once after a fixed sleep, which a loaded machine can
        # schedule before the writer has even started).
        reader = sandbox.run("import os, time\nfirst = None\nseen = set()\nend = time.time() + 3.5\n"
                             "while time.time() < end:\n"
                             "    now = time.time()\n"
                             "    for root in ('/tmp', '/dev/shm'):\n"
                             "        for d, dirs, files in os.walk(root):\n"
                             f"            dirs[:] = [x for x in dirs if os.path.join(d, x) not in {list(KEPT_UNDER_TMP)!r}]\n"
                             "            for f in files:\n"
                             "                seen.add(open(os.path.join(d, f)).read())\n"
                             "    first = first or now\n"
                             "    last = now\n"
                             "    time.sleep(0.05)\n"
                             "print(*sorted(seen))\nprint('scanned', first, last)\n")
        import asyncio

        results = await asyncio.gather(writer, reader)
        assert all(r.ok for r in results), [r.stderr for r in results]
        written, gone = map(float, results[0].stdout.split())
        first, last = map(float, results[1].stdout.split()[-2:])
        assert first <= gone and last >= written, "the reader did not look while the writer's files existed"
        assert secret not in results[1].stdout
        later = await asyncio.gather(*(sandbox.run("import os; print(sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))")
                                       for _ in range(2)))
        assert all(r.stdout == f"{tmp_listing('run', backend=backend)} []\n" for r in later)


async def test_shared_memory_does_not_survive_the_run(sandbox):
    made = await sandbox.run("from multiprocessing import shared_memory\n"
                             "m = shared_memory.SharedMemory(name='leak', create=True, size=64)\n"
                             "m.buf[:4] = b'leak'\nprint('made')\n"
                             "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.shmget(1234, 4096, 0o1666))")
    assert made.stdout.startswith("made"), made.stderr
    assert int(made.stdout.split()[1]) >= 0  # a SysV segment too
    probe = await sandbox.run("from multiprocessing import shared_memory\n"
                              "try:\n    shared_memory.SharedMemory(name='leak')\n    print('FOUND')\n"
                              "except FileNotFoundError:\n    print('gone')\n"
                              "import ctypes\nprint(ctypes.CDLL(None).shmget(1234, 4096, 0o666))")
    assert probe.stdout.split() == ["gone", "-1"]


async def test_no_new_privileges_or_capabilities(sandbox):
    result = await sandbox.run("status = open('/proc/self/status').read()\n"
                               "print([l.split()[1] for l in status.splitlines() if l.startswith(('CapEff', 'NoNewPrivs'))])")
    assert result.stdout == "['0000000000000000', '1']\n"
    assert os.geteuid() != 0 or (await sandbox.run("import os; print(os.getuid())")).stdout.strip() != "0"
