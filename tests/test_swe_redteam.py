"""SWE-v0 red team, after the pre-forked grader (issue 30): attacks a policy could use to raise its reward
or to end its episode unscored. Each earns 0 (the drop reported where there is one) and never raises.

Holes found and fixed here (each test failed before its fix):
- pytest configuration files the drop rules did not know by name (``.pytest.ini``; pytest 9's
  ``pytest.toml``/``.pytest.toml``) or could not see (a ``setup.cfg`` whose ``[tool:pytest]`` sits behind a
  lone ``\\r`` or ``\\u2028``: a line break to pytest's INI parser, none to ``configparser``) loaded a plugin
  from the repository that marked every test passed;
- code under test setting the importing test module's ``pytestmark = pytest.mark.xfail(run=False)``: every
  test "xfailed" with a marker and counted as passed;
- the agent's processes writing on the session interpreter's pipes so that the snapshot's reply was another
  call's: grading raised ``KeyError`` and the episode ended as an error (unscored) instead of a 0;
- through the same pipes, a snapshot of the agent's own naming ``conftest.py\\0.txt``: GNU tar unpacked it
  as ``conftest.py`` (every test passed); a name with a lone surrogate made grading raise;
- a test helper module of the base tree (``tests/helpers.py``) weakened, or shadowed by a top-level
  ``tests.py`` (``tests/`` without ``__init__.py``): the hidden test passed with no fix.
The rest are regression tests for attacks that held.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from environments.swe import SWEEnv
from environments.swe.grading import infra_reason
from tests.sandbox_support import host_processes_matching, requires_bwrap
from tests.swe_support import (
    FIXED_OPS,
    OPS,
    SWE_BACKENDS,
    call,
    mirror_in,
    play,
    swe_sandbox,
    swe_test_sandbox,
)

#: A plugin (or conftest.py) in the repository that turns every test report into a pass.
PASS_ALL_PLUGIN = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return mirror_in(tmp_path_factory)


@pytest.fixture(scope="module", params=SWE_BACKENDS)
def sandbox(request):
    yield from swe_sandbox(request.param)


@pytest.fixture
def env(mirror, sandbox):
    repos, row = mirror
    made = SWEEnv([row], repos_dir=repos, sandbox=sandbox, bash_timeout=10, grading_timeout=60, spare_sessions=0)
    yield made
    made.close()


@pytest.fixture(scope="module")
def process_sandbox():
    yield from swe_sandbox("process")


# ----------------------------------------------------------------------------- holes, fixed
@pytest.mark.parametrize("name, content", [
    ("pytest.toml", '[pytest]\naddopts = ["-p", "calc.evil"]\n'),
    (".pytest.toml", '[pytest]\naddopts = ["-p", "calc.evil"]\n'),
    (".pytest.ini", "[pytest]\naddopts = -p calc.evil\n"),
    ("setup.cfg", "[metadata]\nname = calc\r[tool:pytest]\raddopts = -p calc.evil\n"),
    ("setup.cfg", "[metadata]\nname = calc\u2028[tool:pytest]\u2028addopts = -p calc.evil\n"),
], ids=["pytest.toml", ".pytest.toml", ".pytest.ini", "setup.cfg-cr", "setup.cfg-u2028"])
async def test_every_pytest_config_file_is_dropped(mirror, process_sandbox, name, content):
    """pytest (9 here) reads each of these at the repository root: not dropped, its plugin passed all."""
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=process_sandbox, grading_timeout=60, spare_sessions=0)
    try:
        turns = [call("create", path="calc/evil.py", content=PASS_ALL_PLUGIN), call("create", path=name, content=content),
                 call("bash", command="printf 'def test_fails():\\n    assert False\\n' > tests/test_fails.py; "
                                      "python -m pytest -q tests 2>&1 | tail -1")]
        reward, info, outputs = await play(env, row, *turns)
    finally:
        await env.aclose()
    assert "3 passed" in outputs[2]  # the file does configure pytest: a failing test passes in the workspace
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"
    assert set(info["episode_summary"]["dropped"]) == {name, "tests/test_fails.py"}


async def test_a_hidden_pytest_ini_and_setup_cfg_section_are_dropped_on_both_backends(env, mirror):
    """The two that Debian's pytest 7 (the docker image) reads too, in one episode each."""
    _, row = mirror
    for name, content in ((".pytest.ini", "[pytest]\naddopts = -p calc.evil\n"),
                          ("setup.cfg", "[metadata]\nname = calc\r[tool:pytest]\raddopts = -p calc.evil\n")):
        reward, info, _ = await play(env, row, call("create", path="calc/evil.py", content=PASS_ALL_PLUGIN),
                                     call("create", path=name, content=content))
        assert reward == 0.0 and list(info["episode_summary"]["dropped"]) == [name], name


def test_setup_cfg_edits_outside_the_pytest_section_are_kept(mirror):
    from environments.swe.repos import base_checkout
    from environments.swe.tasks import parse_task

    repos, row = mirror
    checkout = base_checkout(parse_task(row), repos)
    assert infra_reason("setup.cfg", b"[metadata]\nname = calc\r\nversion = 2\n", checkout) is None
    assert infra_reason("setup.cfg", b"[metadata]\nname = calc\x0b[tool:pytest]\x0baddopts = -x\n", checkout)
    assert infra_reason("sub/.pytest.ini", b"", checkout) and infra_reason("a/b/pytest.toml", b"", checkout)
    assert infra_reason("calc/test_extra.py", b"", checkout) == "a test module"
    assert infra_reason("calc/testing/util.py", b"", checkout) == "a file in a test directory"
    assert infra_reason("calc/latest.py", b"", checkout) is None
    assert infra_reason("testing.cpython-311-x86_64-linux-gnu.so", b"", checkout) == "a module named like a test package"


def make_helper_mirror(repos):
    """A repository whose hidden test compares through a helper module of the base tree (tests/helpers.py)."""
    from tests.swe_support import TEST_OPS, git

    repo = repos / "acme__helped"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(OPS)
    (repo / "tests" / "helpers.py").write_text("def close(a, b):\n    return abs(a - b) < 1e-9\n")
    (repo / "tests" / "test_ops.py").write_text(TEST_OPS)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests" / "test_stats.py").write_text(
        "from calc.ops import mean\nfrom tests.helpers import close\n\n\ndef test_mean():\n    assert close(mean([1, 2, 3]), 2)\n")
    git(repo, "add", "-N", "tests/test_stats.py")
    return {"instance_id": "acme__helped-1", "repo": "acme/helped", "base_commit": base, "problem_statement": "mean",
            "patch": "(not used)", "test_patch": git(repo, "diff", "--", "tests"),
            "FAIL_TO_PASS": ["tests/test_stats.py::test_mean"], "PASS_TO_PASS": ["tests/test_ops.py::test_add"]}


async def test_a_test_helper_module_is_test_infrastructure(tmp_path, sandbox):
    """Weakening the helper the hidden test compares with passed it; a fix still does."""
    row = make_helper_mirror(tmp_path)
    env = SWEEnv([row], repos_dir=tmp_path, sandbox=sandbox, grading_timeout=60, spare_sessions=0)
    try:
        reward, info, _ = await play(env, row, call("create", path="tests/helpers.py",
                                                    content="def close(a, b):\n    return True\n"))
        assert reward == 0.0 and info["episode_summary"]["dropped"] == {"tests/helpers.py": "a file in a test directory"}
        # A top-level tests.py shadows the namespace package tests/ (no __init__.py) the hidden test imports.
        shadow = ("import sys, types\n__path__ = []\nhelpers = sys.modules['tests.helpers'] = types.ModuleType('h')\n"
                  "helpers.close = lambda a, b: True\n")
        reward, info, _ = await play(env, row, call("create", path="tests.py", content=shadow))
        assert reward == 0.0 and info["episode_summary"]["dropped"] == {"tests.py": "a module named like a test package"}
        reward, _, _ = await play(env, row, call("create", path="calc/ops.py", content=FIXED_OPS))
        assert reward == 1.0
    finally:
        await env.aclose()


#: At import, from the test module that imports it: every test module on the stack gets an xfail mark
#: that never runs its tests (the marks pytest reads from ``pytestmark`` when it collects the module).
XFAIL_THE_IMPORTER = '''import sys, pytest
frame = sys._getframe()
while frame is not None:
    if frame.f_globals.get("__name__", "").startswith(("tests.", "test_")):
        frame.f_globals["pytestmark"] = pytest.mark.xfail(run=False)
    frame = frame.f_back
'''


async def test_code_under_test_cannot_xfail_the_tests_that_import_it(env, mirror):
    _, row = mirror
    reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=XFAIL_THE_IMPORTER + OPS))
    statuses = env.state.data["grade"].statuses
    # (the module is imported once, by the first test module collected: the hidden one)
    assert statuses["tests/test_stats.py::test_mean"] == statuses["tests/test_stats.py::test_span"] \
        == "xfail-imperative"  # xfailed, but not by a marker of their own
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"


def test_an_xfail_counts_from_the_tests_function_or_class_only(tmp_path):
    from environments.swe.synth import run_suite

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "test_x.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.xfail(reason='module-wide')\n\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_function():\n    assert False\n\n\n"
        "@pytest.mark.xfail(reason='known')\nclass TestClass:\n    def test_method(self):\n        assert False\n\n\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.xfail)])\ndef test_param(x):\n"
        "    assert False\n\n\ndef test_module_only():\n    assert False\n")
    statuses, _ = run_suite(tmp_path / "repo", timeout=60)
    assert statuses == {"test_x.py::test_function": "xfail", "test_x.py::TestClass::test_method": "xfail",
                        "test_x.py::test_param[1]": "xfail", "test_x.py::test_module_only": "xfail-imperative"}


#: Run from the agent's bash: write a well-formed reply for this call and the REPL's end-of-cell report on
#: the session interpreter's own pipes (the REPL is bash's parent, same uid). The server takes them for
#: this call's; the REPL's real reply and report stay in the pipes and answer the next call: the snapshot.
DESYNC = r'''python3 - $PPID <<'PY'
import json, os, struct, sys
repl = sys.argv[1]
fds = f"/proc/{repl}/fd"
def write_end(fd):
    flags = int(open(f"/proc/{repl}/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
    return os.readlink(f"{fds}/{fd}").startswith("pipe:") and flags & 3 == 1
report = [fd for fd in os.listdir(fds) if fd not in ("0", "1", "2") and write_end(fd)]
with open(f"{fds}/1", "w") as out:
    out.write(chr(10) + json.dumps({"ok": {"output": "fine", "exit_code": 0, "timed_out": False}}) + chr(10))
frame = json.dumps({"exit_code": 0}).encode()
for fd in report:
    with open(f"{fds}/{fd}", "wb") as f:
        f.write(struct.pack(">I", len(frame)) + frame)
PY
sleep 0.2
echo the-real-reply'''


async def test_a_desynced_session_makes_the_snapshot_a_lost_workspace_not_an_error(env, mirror):
    _, row = mirror
    await env.areset(options={"task": row})
    await env.astep(call("create", path="calc/ops.py", content=FIXED_OPS))
    observation, *_ = await env.astep(call("bash", command=DESYNC))
    assert observation[0]["content"] == "fine"  # the forged reply was taken for the call's
    await asyncio.sleep(1.5)  # (the model's next turn): the real reply and report wait in the pipes
    _, reward, terminated, _, info = await env.astep(call("submit"))
    assert terminated and reward == 0.0  # before the fix: KeyError('changed') out of step()
    # Which way the stale reply and report fail the snapshot depends on when the REPL's real report reaches
    # its pipe (seen 1 run in 12, before and after this round's sandbox changes): read as the snapshot's
    # (malformed), or leaving the server without a report, which kills the session (SIGKILL). Both grade
    # the episode 0 as a lost workspace; neither is an error or an unscored episode.
    lost = info["episode_summary"]["workspace_lost"]
    assert "malformed" in lost or "did not finish (signal:SIGKILL)" in lost, lost


#: The same channel, used to answer the snapshot with a reply of the agent's own: this bash call is answered
#: at once; a process left behind then writes a snapshot reply and a report for the next call, while the
#: REPL is still busy in this one (``sleep``).
FORGED_SNAPSHOT = DESYNC.replace('''with open(f"{fds}/1", "w") as out:
    out.write(chr(10) + json.dumps({"ok": {"output": "fine", "exit_code": 0, "timed_out": False}}) + chr(10))
frame = json.dumps({"exit_code": 0}).encode()
for fd in report:
    with open(f"{fds}/{fd}", "wb") as f:
        f.write(struct.pack(">I", len(frame)) + frame)''', '''import base64, time
def answer(value):
    with open(f"{fds}/1", "w") as out:
        out.write(chr(10) + json.dumps({"ok": value}) + chr(10))
    frame = json.dumps({"exit_code": 0}).encode()
    for fd in report:
        with open(f"{fds}/{fd}", "wb") as f:
            f.write(struct.pack(">I", len(frame)) + frame)
answer({"output": "fine", "exit_code": 0, "timed_out": False})
if os.fork() == 0:
    os.setsid()
    time.sleep(0.3)
    answer({"changed": {PATH: base64.b64encode(CONTENT.encode()).decode()}, "deleted": [], "odd": [], "too_big": []})
    os._exit(0)''').replace("sleep 0.2\necho the-real-reply", "sleep 8")


@pytest.mark.parametrize("path", ["conftest.py\0.txt", "calc/\ud800.py"], ids=["nul", "surrogate"])
async def test_a_forged_snapshot_cannot_smuggle_a_name_past_the_drop_rules(env, mirror, path):
    """GNU tar cut ``conftest.py\\0.txt`` to ``conftest.py`` (every test passed); a lone surrogate made
    grading raise (an unscored episode). Both are now dropped as names no file can have."""
    _, row = mirror
    forge = FORGED_SNAPSHOT.replace("PATH", repr(path)).replace("CONTENT", repr(PASS_ALL_PLUGIN))
    reward, info, outputs = await play(env, row, call("bash", command=forge))
    assert outputs[0] == "fine"
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"
    assert info["episode_summary"]["dropped"] == {path: "not a file name (a NUL byte, or not encodable)"}


# ----------------------------------------------------------------------------- attacks that held
@requires_bwrap
@pytest.mark.parametrize("prefix", [
    "import os\nos._exit(0)\n",
    "import pytest\npytest.exit('done', returncode=0)\n",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",  # the grader's runner
    "import os, signal\nos.kill(-1, signal.SIGKILL)\n",  # everything of the sandbox's uid (the zygote too)
    "import os, json, __main__\njson.dump({'statuses': {}}, open('../forge_report.json', 'w'))\n"
    "while True:\n    pass\n",  # a timeout
], ids=["os._exit", "pytest.exit", "kill-runner", "kill-all", "timeout"])
async def test_grading_runs_that_end_early_or_hang_are_zero_not_infra(mirror, prefix):
    repos, row = mirror
    box = swe_test_sandbox("process")
    env = SWEEnv([row], repos_dir=repos, sandbox=box, grading_timeout=3, spare_sessions=0)
    try:
        reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=prefix + FIXED_OPS))
        assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"
        # The next grade on the same pool (one grading worker) is not affected.
        reward, _, _ = await play(env, row, call("create", path="calc/ops.py", content=FIXED_OPS))
        assert reward == 1.0
    finally:
        await env.aclose()
        await box.close()


#: Planted by one grade: files in the grading sandbox's /tmp and /dev/shm, a stopped zygote (the grader's
#: pre-forked parent), an environment variable and patched modules in the run's own memory.
POISON = '''import json, os, signal, sys, _pytest.runner
for where in ("/tmp", "/dev/shm"):
    open(os.path.join(where, "forge-poison"), "w").write("x")
os.environ["FORGE_POISON"] = "1"
json.dumps = lambda *a, **k: "{}"
_pytest.runner.runtestprotocol = None
sys.modules["forge_poison"] = sys
for pid in filter(str.isdigit, os.listdir("/proc")):  # the zygote: the server's other child
    try:
        ppid = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
        if ppid == "1" and int(pid) not in (os.getpid(), os.getppid()):
            os.kill(int(pid), signal.SIGSTOP)
    except OSError:
        pass
'''
#: The next grade's fix refuses to import if it finds any of that.
CHECKED_FIX = '''import json, os, sys, _pytest.runner
assert not any(os.path.exists(os.path.join(w, "forge-poison")) for w in ("/tmp", "/dev/shm"))
assert "FORGE_POISON" not in os.environ and "forge_poison" not in sys.modules
assert json.dumps({}) == "{}" and json.dumps([1]) == "[1]" and _pytest.runner.runtestprotocol is not None
''' + FIXED_OPS


async def test_one_grade_leaves_nothing_for_the_next_on_the_same_worker(mirror, sandbox):
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, spare_sessions=0)
    try:
        await play(env, row, call("create", path="calc/ops.py", content=POISON + FIXED_OPS))
        for _ in range(2):  # (TEST_SANDBOX's pool has two grading workers)
            reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=CHECKED_FIX))
            assert reward == 1.0, info["episode_summary"]
    finally:
        await env.aclose()


@requires_bwrap
async def test_the_lean_virtualenv_in_home_never_reaches_grading(mirror, process_sandbox):
    """A .pth in the workspace's home (its lean virtualenv's site-packages) runs in the agent's own python;
    the home is outside the repository: not in the snapshot, its hooks never run in grading."""
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=process_sandbox, grading_timeout=60, spare_sessions=0)
    hooked = FIXED_OPS + "\n\nimport os\nif not os.environ.get('FORGE_HOME_PTH'):\n    mean = lambda xs: 0\n"
    plant = ("echo \"import os; os.environ['FORGE_HOME_PTH'] = '1'\" > $(echo ~/lib/python3*/site-packages)/zz.pth && "
             "printf 'import os\\n' > ~/sitecustomize.py && "
             "python -c 'from calc.ops import mean; print(mean([1, 2, 3]))'")
    try:
        reward, info, outputs = await play(env, row, call("create", path="calc/ops.py", content=hooked),
                                           call("bash", command=plant))
    finally:
        await env.aclose()
    assert outputs[1] == "2.0"  # the agent's python runs the hook
    assert reward == 0.0 and info["episode_summary"]["dropped"] == {}


@requires_bwrap
async def test_a_truncated_episode_is_graded_on_its_snapshot_not_on_what_runs_after(mirror, process_sandbox):
    """max_turns ends the episode while a background process is about to write the fix: the grade is the
    workspace as the turn left it, and the process dies with the workspace."""
    repos, row = mirror
    marker = f"forge-trunc-{uuid.uuid4().hex[:8]}"
    env = SWEEnv([row], repos_dir=repos, sandbox=process_sandbox, grading_timeout=60, spare_sessions=0, max_turns=1)
    later = (f"cp calc/ops.py /tmp/fixed.py && sed -i 's/(len(xs) - 1)/len(xs)/; s/min(xs) + 1/min(xs)/' "
             f"/tmp/fixed.py && nohup setsid bash -c 'exec -a {marker} bash -c \"sleep 2; cp /tmp/fixed.py "
             f"calc/ops.py\"' >/dev/null 2>&1 & echo started")
    try:
        await env.areset(options={"task": row})
        _, reward, terminated, truncated, info = await env.astep(call("bash", command=later))
    finally:
        await env.aclose()
    assert truncated and not terminated and info["truncation_reason"] == "max_turns"
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"
    await asyncio.sleep(2.5)
    assert host_processes_matching(marker) == []


def test_grading_a_diff_leaves_the_per_task_cache_as_it_was(mirror):
    """The base checkout (and the tar pieces cached on it) is shared by every episode of the task: laying
    one episode's changes over it must copy, never change it."""
    from environments.swe.grading import graded_tree, split_changes
    from environments.swe.repos import base_checkout
    from environments.swe.tasks import parse_task
    from forge_env.workspace import Snapshot

    repos, row = mirror
    task = parse_task(row)
    checkout = base_checkout(task, repos)
    clean = graded_tree(checkout, {}, {})
    tree, members = dict(checkout.test_tree), dict(checkout.__dict__["_tar_members"])
    snapshot = Snapshot({"calc/ops.py": FIXED_OPS.encode(), "calc/new.py": b"x = 1\n"}, ["README.md"], [], [])
    kept, dropped = split_changes(snapshot, checkout, task.fail_to_pass + task.pass_to_pass)
    assert graded_tree(checkout, kept, dropped) != clean
    assert checkout.test_tree == tree and checkout.__dict__["_tar_members"] == members
    assert graded_tree(checkout, {}, {}) == clean


# ----------------------------------------------------------------------------- forged outcomes (canaries)
#: The code under test writes an all-passed report where the plugin writes it (the environment variable
#: that named it, or its old fixed name next to the repository), then ends pytest before the plugin does.
FORGE_THE_REPORT = '''import json, os
_path = os.environ.get("FORGE_SWE_REPORT") or os.path.join(os.path.dirname(os.getcwd()), "forge_report.json")
_ids = ["tests/test_stats.py::test_mean", "tests/test_stats.py::test_span", "tests/test_ops.py::test_add",
        "tests/test_ops.py::test_clamp"]
json.dump({"statuses": dict.fromkeys(_ids, "passed"), "messages": {}}, open(_path, "w"))
os._exit(0)
'''
#: Generic: knows nothing of the grader, patches pytest so that every report is a pass.
FORCE_PASS = {
    "call_and_report": '''import _pytest.runner
_real = _pytest.runner.call_and_report
def _forced(item, when, log=True, **kwds):
    report = _real(item, when, log=False, **kwds)
    report.outcome, report.longrepr = "passed", None
    if log:
        item.ihook.pytest_runtest_logreport(report=report)
    return report
_pytest.runner.call_and_report = _forced
''',
    "TestReport": '''from _pytest.reports import TestReport
_real = TestReport.from_item_and_call.__func__
def _forced(cls, item, call):
    report = _real(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report
TestReport.from_item_and_call = classmethod(_forced)
''',
}


@pytest.mark.parametrize("mode", ["resolved", "fraction"])
async def test_a_forged_report_file_earns_nothing(mirror, sandbox, mode):
    """The report's path was in the pytest process's environment (and had a fixed name): three lines wrote
    an all-passed report and ended the run; reward 1 with no fix."""
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, spare_sessions=0, reward_mode=mode)
    try:
        reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=FORGE_THE_REPORT + OPS))
    finally:
        await env.aclose()
    assert reward == 0.0 and info["episode_summary"]["resolved"] is False, info["episode_summary"]


@pytest.mark.parametrize("patch", sorted(FORCE_PASS))
async def test_code_under_test_that_forces_every_report_to_pass_is_caught_by_a_canary(mirror, sandbox, patch):
    """Patching pytest's report making turned every graded test into a pass (reward 1 with no fix); the
    canary appended to each graded module passes too, which only a forged run does."""
    repos, row = mirror
    for mode in ("resolved", "fraction"):
        env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, spare_sessions=0, reward_mode=mode)
        try:
            reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=FORCE_PASS[patch] + OPS))
            grade = env.state.data["grade"]
        finally:
            await env.aclose()
        summary = info["episode_summary"]
        assert grade.statuses["tests/test_stats.py::test_mean"] == "passed"  # the patch did work
        assert reward == 0.0 and summary["resolved"] is False and summary["tampered"] is True, summary
        assert set(summary["tampered_canaries"]) == set(grade.canaries) and len(grade.canaries) == 2
        assert summary["fail_to_pass"] == "2/2" and summary["pass_to_pass"] == "2/2"  # canaries not counted


@pytest.mark.parametrize("mode, expected", [("resolved", 0.0), ("fraction", 0.75)])
async def test_canaries_leave_honest_grades_as_they_were(mirror, sandbox, mode, expected):
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, spare_sessions=0, reward_mode=mode)
    try:
        reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=FIXED_OPS))
        grade = env.state.data["grade"]
        assert reward == 1.0 and "tampered" not in info["episode_summary"], info["episode_summary"]
        assert sorted(grade.canaries.values()) == ["tests/test_ops.py", "tests/test_stats.py"]
        assert all(grade.statuses[c] == "failed" for c in grade.canaries)
        half = OPS.replace("(len(xs) - 1)", "len(xs)")  # mean fixed, span not
        reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=half))
        assert reward == expected and "tampered" not in info["episode_summary"], info["episode_summary"]
        assert info["episode_summary"]["fail_to_pass"] == "1/2" and info["episode_summary"]["pass_to_pass"] == "2/2"
    finally:
        await env.aclose()


def test_canaries_are_plain_failing_functions_and_skip_what_cannot_be_parsed():
    from environments.swe.canary import add_canaries, forged_canaries

    tree = {"t/test_a.py": b"import pytest\npytestmark = pytest.mark.slow\n\nclass TestX:\n    def test_m(self):\n"
                           b"        pass",
            "t/test_b.py": b"def test_b(:\n", "t/test_c.py": b"\xff\xfe", "t/doc.rst": b"x\n"}
    tests = ("t/test_a.py::TestX::test_m", "t/test_b.py::test_b", "t/test_c.py::test_c", "t/test_d.py::test_d",
             "t/doc.rst::doc")
    canaries, skipped = add_canaries(tree, tests)
    [(canary, module)] = canaries.items()
    name = canary.split("::")[1]
    assert module == "t/test_a.py" and name.startswith("test_")
    namespace: dict = {}
    exec(tree["t/test_a.py"].decode().replace("import pytest\npytestmark = pytest.mark.slow\n", ""), namespace)
    with pytest.raises(AssertionError):
        namespace[name]()
    assert set(skipped) == {"t/test_b.py", "t/test_c.py", "t/test_d.py", "t/doc.rst"} and tree["t/doc.rst"] == b"x\n"
    assert add_canaries({"tox.ini": b"[pytest]\npython_functions = check_*\n", "t/test_a.py": b""}, tests[:1])[0] == {}
    graded = ("t/test_a.py::TestX::test_m",)
    assert forged_canaries({graded[0]: "passed", canary: "failed"}, canaries, graded) == []
    assert forged_canaries({graded[0]: "passed", canary: "xfail-imperative"}, canaries, graded) == []
    assert forged_canaries({graded[0]: "passed", canary: "passed"}, canaries, graded) == [canary]
    assert forged_canaries({graded[0]: "passed"}, canaries, graded) == [canary]  # a report without it
    assert forged_canaries({}, canaries, graded) == []  # no report at all (a crash, a timeout)
