"""The process sandbox: running code, each resource limit, the pool (queueing, replacement) and shutdown."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from forge_env.sandbox import (
    ExecResult,
    InvalidFilesError,
    Sandbox,
    SandboxClosedError,
    SandboxLimits,
    make_sandbox,
)
from tests.sandbox_support import host_processes_matching, requires_bwrap, strict_sandbox, tmp_listing
from tests.waiting import wait_until

pytestmark = requires_bwrap


@pytest.fixture
async def sandbox():
    sb = strict_sandbox()
    yield sb
    await sb.close()


async def test_runs_code_and_reports_output(sandbox):
    assert isinstance(sandbox, Sandbox)
    result = await sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert isinstance(result, ExecResult)
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert result.killed_reason is None and not result.timed_out and not result.ok
    assert sandbox.isolation == "bwrap"


async def test_stdin_and_files(sandbox):
    code = "import helper\nprint(helper.double(int(input())), open('data/x.txt').read())"
    result = await sandbox.run(code, stdin="21\n", files={"helper.py": "def double(x):\n    return 2 * x\n",
                                                          "data/x.txt": b"bytes-ok"})
    assert result.ok, result.stderr
    assert result.stdout == "42 bytes-ok\n"


async def test_traceback_points_at_the_users_code(sandbox):
    result = await sandbox.run("x = 1\ndef f():\n    return 1 / 0\nf()\n")
    assert result.exit_code == 1
    assert 'File "main.py", line 3, in f' in result.stderr and "ZeroDivisionError" in result.stderr
    assert "_server" not in result.stderr and '"<string>"' not in result.stderr


async def test_syntax_error_is_a_result(sandbox):
    result = await sandbox.run("def broken(:\n    pass\n")
    assert result.exit_code == 1 and "SyntaxError" in result.stderr


async def test_each_run_starts_from_a_clean_slate():
    async with strict_sandbox(max_concurrency=1) as sandbox:  # one worker: both runs land on it
        first = await sandbox.run(textwrap.dedent("""
            import builtins, json, os
            builtins.LEAK = 1
            json.dumps = None
            open('left.txt', 'w').write('x')
            open('/tmp/left.txt', 'w').write('x')
            print(os.getcwd())
        """))
        assert first.ok, first.stderr
        second = await sandbox.run(textwrap.dedent("""
            import builtins, json, os
            print(hasattr(builtins, 'LEAK'), json.dumps([1]), sorted(os.listdir('.')), sorted(os.listdir('/tmp')))
        """))
        assert second.ok, second.stderr
        assert second.stdout == f"False [1] [] {tmp_listing('run')}\n"


async def test_a_read_only_bind_under_tmp_is_visible_and_survives_the_wipe():
    """The private /tmp is mounted before the binds, so a venv (or data) living under the host's /tmp is
    not hidden by it, and wiping /tmp between runs leaves it alone."""
    host_dir = tempfile.mkdtemp(prefix="forge-env-bind-", dir="/tmp")
    try:
        Path(host_dir, "data.txt").write_text("kept")
        os.chmod(host_dir, 0o755)  # readable by the sandbox's unprivileged uid
        os.chmod(Path(host_dir, "data.txt"), 0o644)
        async with strict_sandbox(max_concurrency=1, ro_binds=(host_dir,)) as sandbox:
            read = f"print(open({str(Path(host_dir, 'data.txt'))!r}).read())"
            first = await sandbox.run(read + "\nopen('/tmp/scratch.txt', 'w').write('x')")
            second = await sandbox.run(read + "\nimport os; print(sorted(os.listdir('/tmp')))")
        assert first.stdout == "kept\n", first.stderr
        assert second.stdout == f"kept\n{tmp_listing('run', Path(host_dir).parts[2])}\n", second.stderr
        assert Path(host_dir, "data.txt").read_text() == "kept"
    finally:
        shutil.rmtree(host_dir)


async def test_randomness_differs_between_runs(sandbox):
    draws = {(await sandbox.run("import random; print(random.random())")).stdout for _ in range(3)}
    assert len(draws) == 3


async def test_exit_codes_and_os_exit(sandbox):
    assert (await sandbox.run("import os; os._exit(7)")).exit_code == 7
    assert (await sandbox.run("raise SystemExit('bye')")).exit_code == 1
    assert (await sandbox.run("raise SystemExit")).exit_code == 0


async def test_cpu_limit():
    async with strict_sandbox(cpu_seconds=1, max_concurrency=1) as sandbox:
        result = await sandbox.run("while True:\n    pass\n", timeout=30)
        assert result.killed_reason == "cpu" and not result.timed_out


async def test_wall_clock_timeout(sandbox):
    result = await sandbox.run("import time\nprint('started', flush=True)\ntime.sleep(60)", timeout=0.5)
    assert result.timed_out and result.killed_reason == "timeout"
    assert result.stdout == "started\n"


async def test_memory_limit(sandbox):
    result = await sandbox.run("data = bytearray(512 * 1024 * 1024)\nprint('allocated')")
    assert result.killed_reason == "memory" and "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


async def test_output_is_capped(sandbox):
    result = await sandbox.run("while True:\n    print('x' * 1000)\n")
    assert result.killed_reason == "output_limit" and result.truncated
    assert len(result.stdout.encode()) <= sandbox.limits.max_output_bytes


async def test_file_size_limit(sandbox):
    result = await sandbox.run("open('big', 'wb').write(b'0' * (8 * 1024 * 1024))")
    assert result.exit_code == 1 and "File too large" in result.stderr


async def test_workdir_size_limit(sandbox):
    code = "for i in range(64):\n    open(f'f{i}', 'wb').write(b'0' * (1024 * 1024))"
    result = await sandbox.run(code)  # 64 files of 1 MiB against a 16 MiB directory
    assert result.exit_code == 1 and "No space left on device" in result.stderr


async def test_open_files_limit(sandbox):
    result = await sandbox.run("handles = [open('/dev/null') for _ in range(1000)]")
    assert result.exit_code == 1 and "Too many open files" in result.stderr


async def test_process_limit(sandbox):
    code = textwrap.dedent("""
        import os, time
        started = 0
        try:
            for _ in range(100):
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                started += 1
        except OSError as exc:
            print(started, exc.errno)
    """)
    result = await sandbox.run(code)
    started, errno_ = map(int, result.stdout.split())
    assert errno_ == 11  # EAGAIN
    assert started == sandbox.limits.max_processes - 1  # the run's own process counts too


async def test_concurrency_cap_queues_the_rest():
    async with strict_sandbox(max_concurrency=2) as sandbox:
        results = await asyncio.gather(*(sandbox.run("import time; time.sleep(0.2); print('done')")
                                         for _ in range(6)))
        assert all(r.stdout == "done\n" for r in results)
        assert sandbox.stats.peak_running == 2
        assert sandbox.stats.peak_waiting >= 4
        assert sandbox.stats.workers_started == 2


async def test_a_crashed_worker_is_replaced():
    async with strict_sandbox(max_concurrency=1) as sandbox:
        assert (await sandbox.run("print(1)")).ok
        worker = sandbox._slots_list[0].worker
        os.kill(worker.pids[-1], signal.SIGKILL)  # the fork server, from outside the sandbox
        await asyncio.sleep(0.2)
        result = await sandbox.run("print(2)")
        assert result.ok and result.stdout == "2\n"
        assert sandbox.stats.workers_replaced == 1


async def test_a_worker_dying_mid_run_is_an_error_result_then_replaced():
    async with strict_sandbox(max_concurrency=1) as sandbox:
        assert (await sandbox.run("print(1)")).ok
        server_pid = sandbox._slots_list[0].worker.pids[-1]
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, os.kill, server_pid, signal.SIGKILL)
        result = await sandbox.run("import time; time.sleep(3)")
        assert result.killed_reason == "sandbox_error" and "replaced" in result.stderr
        assert (await sandbox.run("print(3)")).stdout == "3\n"


async def test_close_leaves_no_processes():
    marker = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 1000}7"
    sandbox = strict_sandbox(max_concurrency=2)
    await sandbox.start()
    pids = [pid for slot in sandbox._slots_list for pid in slot.worker.pids]
    async with sandbox.session() as session:
        await session.run(f"import subprocess; p = subprocess.Popen(['sleep', '{marker}'])")
        # the session keeps it while open (polled: on a busy machine `sleep` may not have exec'd yet)
        await wait_until(lambda: host_processes_matching(f"sleep {marker}"), timeout=30)
        pids += session._worker.pids
    started = {pid: _start_time(pid) for pid in pids}
    await sandbox.close()
    assert host_processes_matching(f"sleep {marker}") == []
    # Same pid and start time means the same process (the busy machine may reuse a pid meanwhile).
    assert [pid for pid in pids if _start_time(pid) == started[pid] and not _is_zombie(pid)] == []
    with pytest.raises(SandboxClosedError):
        await sandbox.run("print(1)")


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_bad_arguments_raise_specific_errors(sandbox):
    with pytest.raises(InvalidFilesError, match="relative path"):
        await sandbox.run("pass", files={"../escape.py": "x"})
    with pytest.raises(InvalidFilesError, match="relative path"):
        await sandbox.run("pass", files={"/etc/passwd": "x"})
    with pytest.raises(InvalidFilesError, match="str or bytes"):
        await sandbox.run("pass", files={"a.py": 3})
    with pytest.raises(ValueError, match="timeout"):
        await sandbox.run("pass", timeout=-1)
    with pytest.raises(TypeError, match="code must be a str"):
        await sandbox.run(b"print(1)")
    with pytest.raises(TypeError, match=r"unknown sandbox option\(s\) \['cpu_secs'\].*cpu_seconds"):
        make_sandbox("process", cpu_secs=1)
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        make_sandbox("vm")
    with pytest.raises(ValueError, match="memory_mb must be a positive number"):
        SandboxLimits(memory_mb=0)


async def test_limits_come_from_keywords():
    sandbox = make_sandbox("process", cpu_seconds=2, memory_mb=300, max_concurrency=3)
    assert sandbox.limits.cpu_seconds == 2 and sandbox.limits.memory_mb == 300
    assert sandbox.max_concurrency == 3
    await sandbox.close()


async def test_one_sandbox_serves_several_event_loops_and_threads():
    sandbox = strict_sandbox(max_concurrency=1)
    try:
        assert (await sandbox.run("print(1)")).ok

        def in_other_loop(n: int):
            return asyncio.run(sandbox.run(f"import time; time.sleep(0.1); print({n})"))

        here = [sandbox.run("import time; time.sleep(0.1); print('here')") for _ in range(2)]
        results = await asyncio.gather(*here, *(asyncio.to_thread(in_other_loop, n) for n in range(3)))
        assert sorted(r.stdout for r in results) == ["0\n", "1\n", "2\n", "here\n", "here\n"]
        assert sandbox.stats.workers_started == 1 and sandbox.stats.peak_running == 1
    finally:
        await sandbox.close()


async def test_rlimits_fallback_still_limits_and_cleans_up():
    marker = f"{uuid.uuid4().int % 1000}.{uuid.uuid4().int % 1000}1"
    sandbox = strict_sandbox(isolation="rlimits", max_concurrency=1)
    assert sandbox.isolation == "rlimits"
    result = await sandbox.run("print(sum(range(10)))")
    assert result.stdout == "45\n"
    assert (await sandbox.run("import time; time.sleep(30)", timeout=0.5)).timed_out
    assert (await sandbox.run("x = bytearray(512 * 1024 * 1024)")).killed_reason == "memory"
    # As root the fallback runs code as an unprivileged uid that may not import modules from a Python
    # installed under /root, so this sticks to `os` (preloaded).
    leftover = await sandbox.run(f"import os\nif os.fork() == 0:\n    os.setsid()\n"
                                 f"    os.execv('/bin/sleep', ['sleep', '{marker}'])")
    assert leftover.ok, leftover.stderr
    assert host_processes_matching(f"sleep {marker}") == []
    scratch = sandbox._slots_list[0].worker._scratch
    assert os.path.isdir(scratch)
    await sandbox.close()
    assert not os.path.exists(scratch)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to switch to an unprivileged user) and a system python3")
def test_works_for_an_unprivileged_caller():
    tmp_path = Path(tempfile.mkdtemp())  # pytest's tmp_path lives in a directory only root may enter
    try:
        _probe_as_nobody(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _probe_as_nobody(tmp_path: Path) -> None:
    # Only the sandbox package and forge_env/errors.py (its one dependency; standard library only) are copied,
    # so the system Python can import them.
    package = tmp_path / "forge_env"
    shutil.copytree(Path(__file__).parents[1] / "forge_env" / "sandbox", package / "sandbox")
    shutil.copy(Path(__file__).parents[1] / "forge_env" / "errors.py", package / "errors.py")
    (package / "__init__.py").write_text("")
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import asyncio, os
        from forge_env.sandbox import make_sandbox

        async def main():
            async with make_sandbox("process", isolation="bwrap", max_processes=8, max_concurrency=1) as sb:
                hello = await sb.run("import os; print('uid', os.getuid())")
                bomb = await sb.run("import os, time\\nn = 0\\ntry:\\n    while True:\\n        if os.fork() == 0:\\n"
                                    "            time.sleep(3); os._exit(0)\\n        n += 1\\nexcept OSError:\\n    print(n)")
                print(os.getuid(), hello.stdout.strip(), bomb.stdout.strip())

        asyncio.run(main())
    """))
    os.chmod(tmp_path, 0o755)
    for path in tmp_path.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    out = subprocess.run(["/usr/bin/python3", str(script)], capture_output=True, text=True, timeout=60,
                         user=65534, group=65534, extra_groups=[], env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["65534", "uid", "1000", "7"]


async def test_prelude_is_built_once_and_every_run_starts_from_it(sandbox):
    prelude = "import json\nCALLS = []\ndef greet(name):\n    CALLS.append(name)\n    return json.dumps({'hi': name})\n"
    first = await sandbox.run("print(greet('a'), CALLS)", prelude=prelude)
    second = await sandbox.run("print(greet('b'), CALLS)", prelude=prelude)
    assert first.stdout == '{"hi": "a"} [\'a\']\n' and second.stdout == '{"hi": "b"} [\'b\']\n'
    broken = await sandbox.run("print(1)", prelude="raise RuntimeError('bad prelude')")
    assert broken.killed_reason == "sandbox_error" and "bad prelude" in broken.stderr
    assert (await sandbox.run("print('fine')")).stdout == "fine\n"
    with pytest.raises(TypeError, match="prelude must be a str"):
        await sandbox.run("pass", prelude=b"x = 1")


async def test_a_prelude_text_crosses_once_per_worker_and_more_preludes_than_kept_still_work():
    from forge_env.sandbox.workers import PRELUDES_KEPT

    async with strict_sandbox(max_concurrency=1) as sandbox:  # one worker: every run meets the same one
        await _cycle_preludes(sandbox, PRELUDES_KEPT)


async def _cycle_preludes(sandbox, kept):
    preludes = [f"WHICH = {n}\n" for n in range(kept + 2)]
    replaced = sandbox.stats.workers_replaced
    sent = []
    original = sandbox._prelude_once
    sandbox._prelude_once = lambda worker, message: sent.append(original(worker, message)) or sent[-1]
    for _ in range(2):  # the second pass finds the first preludes dropped on both sides
        for n, prelude in enumerate(preludes):
            result = await sandbox.run("print(WHICH)", prelude=prelude)
            assert result.stdout == f"{n}\n", result.stderr
    assert sandbox.stats.workers_replaced == replaced
    again = await sandbox.run("print(WHICH)", prelude=preludes[-1])
    assert again.stdout == f"{len(preludes) - 1}\n"
    assert sent[-1]["prelude"] is None and sent[-1]["prelude_key"]  # named only: its text was sent already


async def test_without_bubblewrap_auto_falls_back_with_a_warning(monkeypatch, caplog):
    import forge_env.sandbox.process as process_backend

    monkeypatch.setattr(process_backend, "bwrap_executable", lambda: None)
    with caplog.at_level("WARNING", logger="forge_env.sandbox.process"):
        sandbox = make_sandbox("process", isolation="auto", max_concurrency=1)
    assert sandbox.isolation == "rlimits"
    assert "falling back to rlimits only" in caplog.text and "Install bubblewrap" in caplog.text
    try:
        assert (await sandbox.run("print(6 * 7)")).stdout == "42\n"
    finally:
        await sandbox.close()


def test_an_unclosed_sandbox_is_cleaned_up_when_collected():
    import gc

    from forge_env.utils.aio import run_sync

    sandbox = strict_sandbox(isolation="rlimits", max_concurrency=1)
    assert run_sync(sandbox.run("print(1)")).ok
    pids, scratch = sandbox.worker_pids, sandbox._slots_list[0].worker._scratch
    started = {pid: _start_time(pid) for pid in pids}
    del sandbox
    gc.collect()
    assert not os.path.exists(scratch)
    assert [pid for pid in pids if _start_time(pid) == started[pid] and not _is_zombie(pid)] == []
