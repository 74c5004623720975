"""Sandbox v2: what RLIMIT_AS and a shared worker could not contain.

Each test is an attack that got through before (memory outside RLIMIT_AS, kernel state that outlives a
run, residue of earlier runs in memory or on disk, wipes that a run could defeat). Every test also shows
the worker keeps serving afterwards. The tests on the ``sandbox`` fixture hold on both backends (on
``docker`` the container's cgroup, tmpfs options, seccomp profile and the server's wipe of /dev/mqueue do
what the process backend's cgroup, scratch mounts and seccomp filter do); the others are about the
process backend's own machinery (its fallbacks, cgroup accounting, unprivileged callers, retiring).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.sandbox_support import BACKENDS, requires_bwrap, strict_sandbox

#: What the memory tests try to hold: far more than the worker's whole budget (see cgroup.py).
HOG_MB = 640
MEMORY_LIMITS = dict(memory_mb=128, file_size_mb=16, open_files=64, workdir_size_mb=16)
WORKER_BUDGET_MB = 128 + 2 * 16 + 128


@pytest.fixture(params=BACKENDS)
async def sandbox(request):
    sb = strict_sandbox(request.param, max_concurrency=1, **MEMORY_LIMITS)
    yield sb
    assert (await sb.run("print('still serving')")).stdout == "still serving\n"
    await sb.close()


def held_mb(result) -> int:
    """The MB a hog program reported holding before it was stopped (its last progress line)."""
    lines = [line for line in result.stdout.split() if line.isdigit()]
    return int(lines[-1]) if lines else 0


# --- memory outside RLIMIT_AS -------------------------------------------------------------------------


async def test_memfd_pages_count_against_the_worker(sandbox):
    code = textwrap.dedent(f"""
        import os, sys
        fds = []
        for i in range({HOG_MB // 16}):
            fd = os.memfd_create('hog')
            os.write(fd, b'x' * (16 << 20))
            fds.append(fd)
            print((i + 1) * 16, flush=True)
    """)
    result = await sandbox.run(code, timeout=20)
    assert held_mb(result) < WORKER_BUDGET_MB, result
    assert result.killed_reason == "memory", result


async def test_sysv_shared_memory_touched_and_detached_counts(sandbox):
    code = textwrap.dedent(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        for i in range({HOG_MB // 16}):
            ident = libc.shmget(0, 16 << 20, 0o1600)
            assert ident >= 0, ctypes.get_errno()
            address = libc.shmat(ident, None, 0)
            ctypes.memset(address, 1, 16 << 20)
            libc.shmdt(ctypes.c_void_p(address))
            print((i + 1) * 16, flush=True)
    """)
    result = await sandbox.run(code, timeout=20)
    assert held_mb(result) < WORKER_BUDGET_MB, result
    assert result.killed_reason == "memory", result
    probe = await sandbox.run("print(open('/proc/sysvipc/shm').read().count(chr(10)))")
    assert probe.stdout == "1\n"  # the header line only: the segments went with the run


async def test_no_user_namespace_and_so_no_private_tmpfs(sandbox):
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            print('refused', os.strerror(ctypes.get_errno()))
        else:
            uid = os.getuid()  # (before the maps: unmapped it reads 65534)
            print('UNSHARED')
    """)
    result = await sandbox.run(code)
    assert result.stdout.startswith("refused"), result
    # clone() with CLONE_NEWUSER is refused too (what unshare(1) or a raw clone would use).
    if NR is not None:
        raw = await sandbox.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                f"pid = libc.syscall({NR['clone']}, 0x10000000 | 17, 0, 0, 0, 0)\n"
                                "import os\nif pid == 0: os._exit(0)\nprint(pid, ctypes.get_errno())")
        assert raw.stdout.split()[0] == "-1", raw


async def test_tmpfs_has_an_inode_limit(sandbox):
    if os.geteuid() != 0:
        pytest.skip("the inode limit needs a root caller (see docs/sandbox.md)")
    code = textwrap.dedent("""
        import os
        made = 0
        try:
            for i in range(120_000):
                os.close(os.open(f'/tmp/f{i}', os.O_CREAT | os.O_WRONLY, 0o600))
                made += 1
        except OSError as exc:
            print(made, exc.strerror)
    """)
    result = await sandbox.run(code, timeout=20)
    made = int(result.stdout.split()[0]) if result.stdout else 120_000
    assert made <= 4096, result  # the default max_files
    assert "No space left" in result.stdout
    assert (await sandbox.run("import os; print(len(os.listdir('/tmp')))")).stdout.strip() in ("1", "2")


# --- kernel state: keyrings, POSIX message queues ------------------------------------------------------


KEYCTL_SEARCH, KEYCTL_READ, KEY_SPEC_SESSION_KEYRING = 10, 11, -3
#: System call numbers (the keyring calls have no libc wrapper).
NR = {"x86_64": {"add_key": 248, "keyctl": 250, "clone": 56},
      "aarch64": {"add_key": 217, "keyctl": 219, "clone": 220}}.get(os.uname().machine)
needs_nr = pytest.mark.skipif(NR is None, reason="system call numbers known for x86_64 and aarch64 only")


@needs_nr
async def test_host_session_keyring_is_out_of_reach(sandbox):
    libc = ctypes.CDLL(None, use_errno=True)
    description = f"forge-test-{uuid.uuid4().hex}".encode()
    key = libc.syscall(NR["add_key"], b"user", description, b"host-secret", 11, KEY_SPEC_SESSION_KEYRING)
    if key < 0:
        pytest.skip(f"cannot add a key on the host: {os.strerror(ctypes.get_errno())}")
    try:
        code = textwrap.dedent(f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            found = libc.syscall({NR["keyctl"]}, {KEYCTL_SEARCH}, {KEY_SPEC_SESSION_KEYRING}, b'user', {description!r}, 0)
            buf = ctypes.create_string_buffer(64)
            n = libc.syscall({NR["keyctl"]}, {KEYCTL_READ}, found, buf, 64) if found > 0 else -1
            print(found, buf.raw[:max(n, 0)])
            planted = libc.syscall({NR["add_key"]}, b'user', b'planted', b'x', 1, {KEY_SPEC_SESSION_KEYRING})
            print('planted', planted)
        """)
        result = await sandbox.run(code)
        assert "host-secret" not in result.stdout, result
        assert result.stdout.split()[0] == "-1" and "planted -1" in result.stdout, result
    finally:
        libc.syscall(NR["keyctl"], 3, key)  # KEYCTL_REVOKE


@needs_nr
async def test_keys_do_not_carry_into_the_next_run(sandbox):
    plant = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             f"print(libc.syscall({NR['add_key']}, b'user', b'carry', b'run-one', 7, -4))")  # the user keyring
    await sandbox.run(plant)
    probe = await sandbox.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                              f"print(libc.syscall({NR['keyctl']}, 10, -4, b'user', b'carry', 0))")
    assert probe.stdout.strip() == "-1", probe


@requires_bwrap
@needs_nr
async def test_without_namespaces_keyrings_are_still_fresh_and_cleared():
    # The rlimits fallback has no seccomp filter: the server and every run join a new session keyring,
    # and the per-uid keyrings are cleared after each run.
    libc = ctypes.CDLL(None, use_errno=True)
    description = f"forge-test-{uuid.uuid4().hex}".encode()
    key = libc.syscall(NR["add_key"], b"user", description, b"host-secret", 11, KEY_SPEC_SESSION_KEYRING)
    sandbox = strict_sandbox(isolation="rlimits", max_concurrency=1)
    try:
        read = await sandbox.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                 f"print(libc.syscall({NR['keyctl']}, {KEYCTL_SEARCH}, {KEY_SPEC_SESSION_KEYRING}, "
                                 f"b'user', {description!r}, 0))\n"
                                 f"print(libc.syscall({NR['add_key']}, b'user', b'carry', b'x', 1, -4) > 0)")
        assert read.stdout.split() == ["-1", "True"] or key < 0, read
        probe = await sandbox.run("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                                  f"print(libc.syscall({NR['keyctl']}, {KEYCTL_SEARCH}, -4, b'user', b'carry', 0))")
        assert probe.stdout.strip() == "-1", probe
    finally:
        await sandbox.close()
        if key > 0:
            libc.syscall(NR["keyctl"], 3, key)


async def test_posix_message_queues_do_not_carry_into_the_next_run(sandbox):
    send = textwrap.dedent("""
        import ctypes
        libc = ctypes.CDLL('libc.so.6', use_errno=True)
        q = libc.mq_open(b'/forge-leak', 0o100 | 2, 0o600, None)
        print('opened', q, libc.mq_send(q, b'secret', 6, 0) if q >= 0 else -1)
    """)
    await sandbox.run(send)
    receive = textwrap.dedent("""
        import ctypes
        libc = ctypes.CDLL('libc.so.6', use_errno=True)
        q = libc.mq_open(b'/forge-leak', 2)
        buf = ctypes.create_string_buffer(8192)
        n = libc.mq_receive(q, buf, 8192, None) if q >= 0 else 0
        print('got', buf.raw[:max(n, 0)])
    """)
    result = await sandbox.run(receive, timeout=3)
    assert result.stdout == "got b''\n", result


# --- residue between runs --------------------------------------------------------------------------------


SCAN_OWN_MEMORY = textwrap.dedent("""
    import re
    head, tail = {head!r}.encode(), {tail!r}.encode()  # never joined here: only earlier runs held the marker
    hits = 0
    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:
        for line in maps.read().splitlines():
            span, perms = line.split()[:2]
            if not perms.startswith('r') or '[vvar' in line or '[vsyscall' in line:
                continue
            start, end = (int(x, 16) for x in span.split('-'))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            at = chunk.find(head)
            while at != -1:
                hits += chunk[at + len(head):at + len(head) + len(tail)] == tail
                at = chunk.find(head, at + 1)
            del chunk
    print('hits', hits)
""")


async def test_a_run_cannot_find_earlier_runs_in_its_memory(sandbox):
    head, tail = uuid.uuid4().hex, uuid.uuid4().hex
    first = await sandbox.run(f"print('{head}{tail}')", stdin=f"{head}{tail}\n" * 4, files={"x.txt": head + tail})
    assert first.stdout == f"{head}{tail}\n"
    scan = await sandbox.run(SCAN_OWN_MEMORY.format(head=head, tail=tail), timeout=20)
    assert scan.ok, scan.stderr
    assert scan.stdout == "hits 0\n", scan


async def test_a_deep_tree_and_a_mode_000_directory_do_not_break_the_wipe(sandbox):
    deep = textwrap.dedent("""
        import os
        os.chdir('/tmp')
        for i in range(1500):
            os.mkdir('d')
            os.chdir('d')
        open('leaf', 'w').write('x')
        print('deep')
    """)
    locked = textwrap.dedent("""
        import os
        os.makedirs('/dev/shm/locked/inner/more')
        open('/dev/shm/locked/inner/file', 'w').write('x')
        os.chmod('/dev/shm/locked/inner', 0)
        os.chmod('/dev/shm/locked', 0)
        os.makedirs('box/sub')
        os.chmod('box/sub', 0)
        os.chmod('box', 0)
        print('locked')
    """)
    assert (await sandbox.run(deep)).stdout == "deep\n"
    assert (await sandbox.run(locked)).stdout == "locked\n"
    for _ in range(3):
        after = await sandbox.run("import os; print(sorted(os.listdir('/dev/shm')), os.listdir('.'))")
        assert after.stdout == "[] []\n", after
    assert sandbox.stats.sandbox_errors == 0 and sandbox.stats.workers_replaced == 0


async def test_the_zygote_is_out_of_reach(sandbox):
    code = textwrap.dedent("""
        import os
        me = os.getpid()
        others = [e for e in os.listdir('/proc') if e.isdigit() and int(e) not in (1, me)]
        for pid in others:
            for name in ['mem', 'environ', 'fd/0', 'maps']:
                try:
                    open(f'/proc/{pid}/{name}', 'rb').read(1)
                    print('OPENED', name)
                except OSError:
                    print('refused')
    """)
    result = await sandbox.run(code)
    assert "OPENED" not in result.stdout and result.stdout.count("refused") == 4, result


async def test_killing_or_stopping_the_zygote_costs_nothing_but_a_restart(sandbox):
    code = textwrap.dedent("""
        import os, signal
        me = os.getpid()
        for entry in os.listdir('/proc'):
            if entry.isdigit() and int(entry) not in (1, me):
                os.kill(int(entry), signal.SIGSTOP if {stop} else signal.SIGKILL)
        print('done')
    """)
    assert (await sandbox.run(code.format(stop=True))).stdout == "done\n"
    assert (await sandbox.run("print(6 * 7)")).stdout == "42\n"
    assert (await sandbox.run(code.format(stop=False))).stdout == "done\n"
    assert (await sandbox.run("print(6 * 7)")).stdout == "42\n"
    assert sandbox.stats.sandbox_errors == 0


@requires_bwrap
async def test_memory_accounting_is_reported():
    sandbox = strict_sandbox(max_concurrency=1)
    try:
        version = "v2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "v1"
        expected = f"cgroup-{version}" if os.geteuid() == 0 else sandbox.memory_accounting
        assert sandbox.memory_accounting == expected
    finally:
        await sandbox.close()


# --- a caller that is not root ---------------------------------------------------------------------------


@requires_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to switch to an unprivileged user) and a system python3")
@needs_nr
def test_hardening_holds_for_an_unprivileged_caller():
    tmp_path = Path(tempfile.mkdtemp())
    try:
        package = tmp_path / "forge_env"
        shutil.copytree(Path(__file__).parents[1] / "forge_env" / "sandbox", package / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(Path(__file__).parents[1] / "forge_env" / "errors.py", package / "errors.py")  # its one dependency
        (package / "__init__.py").write_text("")
        head, tail = uuid.uuid4().hex, uuid.uuid4().hex
        script = tmp_path / "probe.py"
        script.write_text(textwrap.dedent(f"""
            import asyncio, logging
            from forge_env.sandbox import make_sandbox
            logging.basicConfig(level=logging.WARNING)
            KERNEL = '''
            import ctypes
            libc = ctypes.CDLL('libc.so.6', use_errno=True)
            print(libc.unshare(0x10000000), libc.syscall({NR['keyctl']}, 1, None), libc.mq_open(b'/q', 0o100 | 2, 0o600, None))
            '''
            DEEP = "import os\\nfor i in range(1500):\\n    os.mkdir('d'); os.chdir('d')\\nos.chmod('..', 0)\\nprint('deep')"
            async def main():
                async with make_sandbox("process", isolation="bwrap", max_concurrency=1) as sb:
                    print('accounting', sb.memory_accounting)
                    print('kernel', (await sb.run(KERNEL)).stdout.strip())
                    print((await sb.run(DEEP)).stdout.strip())
                    print('after', (await sb.run("import os; print(os.listdir('.'))")).stdout.strip())
                    await sb.run("print('{head}{tail}')")
                    print((await sb.run({SCAN_OWN_MEMORY.format(head=head, tail=tail)!r}, timeout=20)).stdout.strip())
            asyncio.run(main())
        """))
        os.chmod(tmp_path, 0o755)
        for path in tmp_path.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        out = subprocess.run(["/usr/bin/python3", str(script)], capture_output=True, text=True, timeout=120,
                             user=65534, group=65534, extra_groups=[], cwd=tmp_path,
                             env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == "accounting rlimit" and "no memory cgroup" in out.stderr  # v1 needs root: a warning
        assert lines[1] == "kernel -1 -1 -1", out.stdout
        assert lines[2:] == ["deep", "after []", "hits 0"], out.stdout
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


# --- a worker that could not clean up is never reused ----------------------------------------------------


class _ScriptedWorker:
    """Answers like a fork server whose cleanup failed after its first run. No hostile program can make the
    real wipe fail (that is the point of it), so the pool's side of the contract is driven directly."""

    def __init__(self, number: int) -> None:
        self.number, self.closed, self.runs = number, False, 0

    @property
    def alive(self) -> bool:
        return not self.closed

    @property
    def pids(self) -> list[int]:
        return []

    async def request(self, message, timeout):
        self.runs += 1
        reply = {"stdout": "", "stderr": "", "exit_code": 0, "timed_out": False, "killed_reason": None,
                 "duration_s": 0.0, "truncated": False}
        if self.runs == 1:
            reply["retire"] = "cannot remove 'x': Permission denied"
        return reply

    async def close(self) -> None:
        self.closed = True


@requires_bwrap
async def test_a_worker_whose_cleanup_failed_is_replaced_not_reused():
    from forge_env.sandbox.pool import PooledSandbox

    workers: list[_ScriptedWorker] = []

    class Scripted(PooledSandbox):
        async def _spawn(self, kind):
            workers.append(_ScriptedWorker(len(workers)))
            return workers[-1]

    sandbox = Scripted(max_concurrency=1)
    first = await sandbox.run("pass")
    assert first.ok  # the run's own result stands
    assert workers[0].closed and sandbox.stats.workers_replaced == 1
    await sandbox.run("pass")
    assert len(workers) == 2 and workers[0].runs == 1 and workers[1].runs == 1
    await sandbox.close()
