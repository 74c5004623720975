"""SWE-v0 reward hacks: each earns 0 (the drop reported in ``info``), and none ends as an InfraError."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from environments.swe import SWEEnv
from tests.sandbox_support import host_processes_matching
from tests.swe_support import FIXED_OPS, TEST_STATS, call, play
from tests.test_swe_env import env, mirror, sandbox  # noqa: F401  (fixtures)

PASS_ALL_CONFTEST = '''import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
'''
FAKE_PYTEST = '''import json, os, sys
statuses = {t: "passed" for t in sys.argv[1:] if "::" in t}
open(os.environ.get("FORGE_SWE_REPORT", "/tmp/r.json"), "w").write(json.dumps(statuses))
print(json.dumps({"statuses": statuses, "tail": ""}))
'''


async def test_conftest_that_marks_every_test_passed_is_dropped(env, mirror):  # noqa: F811
    _, row = mirror
    turns = [call("create", path="conftest.py", content=PASS_ALL_CONFTEST),
             call("create", path="tests/conftest.py", content=PASS_ALL_CONFTEST),
             call("bash", command="python -m pytest -q tests 2>&1 | tail -1")]
    reward, info, outputs = await play(env, row, *turns)
    assert "passed" in outputs[2]  # it does fool pytest in the workspace
    assert reward == 0.0
    dropped = info["episode_summary"]["dropped"]
    assert dropped == {"conftest.py": "test infrastructure (conftest.py)",
                       "tests/conftest.py": "test infrastructure (conftest.py)"}


async def test_writing_the_hidden_tests_or_deleting_tests_earns_nothing(env, mirror):  # noqa: F811
    _, row = mirror
    trivial = TEST_STATS.replace("assert mean([1, 2, 3]) == 2", "pass").replace("assert span([1, 5, 2]) == 4", "pass")
    reward, info, _ = await play(env, row, call("create", path="tests/test_stats.py", content=trivial))
    assert reward == 0.0
    assert info["episode_summary"]["dropped"] == {"tests/test_stats.py": "a file the hidden tests touch"}
    broken = FIXED_OPS.replace("return a + b", "return a - b")  # fixes mean and span, breaks add
    weakened = "def test_add():\n    pass\n\n\ndef test_clamp():\n    pass\n"
    turns = [call("create", path="calc/ops.py", content=broken),
             call("create", path="tests/test_ops.py", content=weakened),
             call("create", path="tests/__init__.py", content="import os\n")]
    reward, info, _ = await play(env, row, *turns)
    assert reward == 0.0 and info["episode_summary"]["pass_to_pass"] == "1/2"
    assert info["episode_summary"]["dropped"] == {"tests/test_ops.py": "a file holding graded tests",
                                                  "tests/__init__.py": "a test package's __init__.py"}
    reward, info, _ = await play(env, row, call("bash", command="rm tests/test_ops.py"))
    assert info["episode_summary"]["dropped"] == {"tests/test_ops.py": "a file holding graded tests"}
    assert reward == 0.0 and info["episode_summary"]["pass_to_pass"] == "2/2"  # deleted tests still run


async def test_startup_hooks_and_a_fake_pytest_are_dropped_or_ignored(env, mirror):  # noqa: F811
    _, row = mirror
    hook = "import os\nos.environ['FORGE_HACKED'] = '1'\n"
    turns = [call("create", path="sitecustomize.py", content=hook),
             call("create", path="usercustomize.py", content=hook),
             call("create", path="calc/evil.pth", content="import sitecustomize\n"),
             call("create", path="pytest.ini", content="[pytest]\naddopts = -p no:python\n"),
             call("create", path="pytest.py", content=FAKE_PYTEST),
             call("create", path="calc/__pycache__/ops.cpython-312.pyc", content="junk")]
    reward, info, _ = await play(env, row, *turns)
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"
    assert info["episode_summary"]["pass_to_pass"] == "2/2"  # the real pytest ran, not pytest.py
    assert set(info["episode_summary"]["dropped"]) == {"sitecustomize.py", "usercustomize.py", "calc/evil.pth",
                                                      "pytest.ini", "calc/__pycache__/ops.cpython-312.pyc"}


async def test_hidden_tests_and_the_fix_are_not_reachable_through_git_or_the_file_system(env, mirror):  # noqa: F811
    repos, row = mirror
    probe = (f"git log --all --oneline | wc -l; git branch -a; git cat-file -t {row['fix_commit']} 2>&1; "
             f"git cat-file -t {row['base_commit']} 2>&1; ls {repos} 2>&1; env | grep -c {repos.name}; "
             f"grep -rl 'def test_mean' /tmp /etc /home /root /work / 2>/dev/null --exclude-dir=proc --exclude-dir=sys "
             f"--exclude-dir=usr --exclude-dir=lib --exclude-dir=dev | head -3; "
             f"echo done")
    reward, _, outputs = await play(env, row, call("bash", command=probe))
    lines = outputs[0].splitlines()
    assert lines[0].strip() == "1" and lines[1].strip() == "* main"  # one commit, one branch: no 'answers'
    assert "Not a valid object name" in lines[2] or "could not get object info" in lines[2]
    assert "Not a valid object name" in lines[3] or "could not get object info" in lines[3]  # not the mirror's
    assert "No such file or directory" in lines[4] and lines[5].strip() == "0"
    assert lines[6:] == ["done", "[exit code 0]"] or lines[6] == "done"
    assert reward == 0.0


async def test_a_background_process_cannot_change_files_after_submit(env, mirror):  # noqa: F811
    _, row = mirror
    marker = f"forge-bg-{uuid.uuid4().hex[:8]}"
    fixed = FIXED_OPS.replace("'", "'\\''")
    rewriter = (f"nohup setsid bash -c 'exec -a {marker} bash -c \"sleep 1; while true; do printf %s '\"'\"'{fixed}'\"'\"' "
                f"> calc/ops.py; sleep 0.1; done\"' >/dev/null 2>&1 &")
    reward, info, outputs = await play(env, row, call("bash", command=rewriter + " echo started"))
    assert "started" in outputs[0]
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"
    await asyncio.sleep(0.5)
    assert host_processes_matching(marker) == []


async def test_filling_the_disk_and_spawning_processes_are_bounded_and_the_episode_goes_on(env, mirror):  # noqa: F811
    _, row = mirror
    turns = [call("bash", command="dd if=/dev/zero of=big bs=1M count=200 2>/dev/null; echo rc=$?; stat -c %s big"),
             call("bash", command="for i in $(seq 200); do (sleep 60 &) ; done 2>&1 | tail -1; echo spawned"),
             call("bash", command="rm -f big; echo alive"),
             call("create", path="calc/ops.py", content=FIXED_OPS)]
    reward, info, outputs = await play(env, row, *turns)
    assert "rc=0" not in outputs[0] and int(outputs[0].splitlines()[-1]) <= 64 << 20
    assert "alive" in outputs[2] or "Resource temporarily unavailable" in outputs[2]  # bounded, an observation
    assert reward == 1.0 and info["episode_summary"]["resolved"] is True


def test_env_passes_check_env(mirror, sandbox):  # noqa: F811
    from forge_env.core.checker import check_env
    repos, row = mirror
    check_env(lambda: SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60), max_steps=6)


@pytest.mark.parametrize("n", [32])
async def test_concurrent_episodes_leave_no_workspace_or_process(mirror, sandbox, n):  # noqa: F811
    repos, row = mirror
    marker = f"forge-conc-{uuid.uuid4().hex[:8]}"
    envs = [SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60) for _ in range(n)]
    keep = call("bash", command=f"nohup setsid bash -c 'exec -a {marker} sleep 300' >/dev/null 2>&1 & echo ok")
    results = await asyncio.gather(*(play(e, row, keep, call("create", path="calc/ops.py", content=FIXED_OPS))
                                     for e in envs))
    assert [r for r, _, _ in results] == [1.0] * n
    await asyncio.sleep(0.5)
    assert host_processes_matching(marker) == []
    assert len(sandbox._sessions) <= 2  # the spare sessions (started ahead, never used), no episode's
