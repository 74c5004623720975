"""SWE-v0's verdict is the ``swebench`` package's: per-test statuses from our report plugin are mapped to
swebench's ``TestStatus`` and graded by ``swebench.harness.grading``; ``info["episode_summary"]`` agrees
with swebench's own computation on real episodes, and with forge-env's fallback rule on every combination
of statuses. The two deliberate differences (a skip or an imperative ``pytest.xfail()`` from code under
test is no pass) are reward hacks, tested here through the env on both backends."""

from __future__ import annotations

import itertools

import pytest

# swebench is in the dev extra that `make install` installs: missing, this module fails (fail closed).
import pytest_asyncio  # noqa: E402,F401  (dev extra, likewise: the asyncio-plugin tests need it)
import swebench  # noqa: E402
from swebench.harness import constants, grading  # noqa: E402

from environments.swe import SWEEnv
from environments.swe.verdict import TO_SWEBENCH, status_map, swebench_grading, verdict
from tests.swe_support import (
    FAIL_TO_PASS,
    FIXED_OPS,
    OPS,
    PASS_TO_PASS,
    SWE_BACKENDS,
    call,
    mirror_in,
    play,
    swe_sandbox,
    swe_test_sandbox,
)

STATUSES = ["passed", "xfail", "failed", "error", "skipped", "xpass", "xfail-imperative", "missing"]


def swebench_says(statuses: dict[str, str], f2p: list[str], p2p: list[str]) -> tuple[bool, int, int]:
    """(resolved, F2P passed, P2P passed) as swebench computes them from our status map."""
    report = grading.get_eval_tests_report(status_map(statuses),
                                           {constants.FAIL_TO_PASS: f2p, constants.PASS_TO_PASS: p2p})
    resolved = grading.get_resolution_status(report) == constants.ResolvedStatus.FULL.value
    return (resolved, round(grading.compute_fail_to_pass(report) * len(f2p)),
            round(grading.compute_pass_to_pass(report) * len(p2p)))


def test_every_status_we_report_has_a_swebench_status():
    assert set(TO_SWEBENCH.values()) <= {s.value for s in constants.TestStatus}
    assert swebench_grading() is not None


def test_swebench_and_the_fallback_rule_agree_on_every_combination_of_statuses():
    f2p, p2p = ("t::a", "t::b"), ("t::c", "t::d")
    for combination in itertools.product(STATUSES, repeat=4):
        statuses = dict(zip(f2p + p2p, combination, strict=True))
        ours = verdict(statuses, f2p, p2p)
        assert ours.by == f"swebench {swebench.__version__}"
        passed = {"passed", "xfail"}
        fallback = (sum(statuses[t] in passed for t in f2p), sum(statuses[t] in passed for t in p2p))
        assert (ours.fail_to_pass_passed, ours.pass_to_pass_passed) == fallback, statuses
        assert ours.resolved == (fallback == (2, 2)), statuses
        assert (ours.resolved, ours.fail_to_pass_passed, ours.pass_to_pass_passed) == swebench_says(
            statuses, list(f2p), list(p2p)), statuses


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return mirror_in(tmp_path_factory)


@pytest.fixture(scope="module", params=SWE_BACKENDS)
def sandbox(request):
    yield from swe_sandbox(request.param)


HALF_FIX = OPS.replace("(len(xs) - 1)", "len(xs)")  # mean fixed, span not


@pytest.mark.parametrize("content, resolved", [(FIXED_OPS, True), (HALF_FIX, False), (OPS, False)],
                         ids=["fixed", "half", "unchanged"])
async def test_episode_summary_agrees_with_swebenchs_own_computation(mirror, sandbox, content, resolved):
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, spare_sessions=0)
    try:
        reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=content))
        statuses = env.state.data["grade"].statuses
    finally:
        await env.aclose()
    summary = info["episode_summary"]
    said, f2p, p2p = swebench_says(statuses, FAIL_TO_PASS, PASS_TO_PASS)
    assert summary["resolved"] is said is resolved and reward == float(resolved)
    assert summary["fail_to_pass"] == f"{f2p}/2" and summary["pass_to_pass"] == f"{p2p}/2"
    assert summary["verdict_by"] == f"swebench {swebench.__version__}"


SKIP_AND_XFAIL = FIXED_OPS.replace('def add(a, b):\n    return a + b',
                                   'def add(a, b):\n    import unittest\n    raise unittest.SkipTest("later")') \
    .replace("def mean(xs):\n", "def mean(xs):\n    import pytest\n    pytest.xfail('known')\n") \
    .replace("def span(xs):\n", "def span(xs):\n    import pytest\n    pytest.xfail('known')\n")


async def test_tests_that_code_under_test_skips_or_xfails_are_not_passed(mirror, sandbox):
    """swebench would count the skipped PASS_TO_PASS test as maintained and an xfail as passed; code under
    test can raise both, so neither counts here."""
    repos, row = mirror
    assert "SkipTest" in SKIP_AND_XFAIL and SKIP_AND_XFAIL.count("pytest.xfail") == 2
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, spare_sessions=0,
                 reward_mode="fraction")
    try:
        reward, info, _ = await play(env, row, call("create", path="calc/ops.py", content=SKIP_AND_XFAIL))
        statuses = env.state.data["grade"].statuses
    finally:
        await env.aclose()
    assert statuses["tests/test_ops.py::test_add"] == "skipped"
    assert statuses["tests/test_stats.py::test_mean"] == statuses["tests/test_stats.py::test_span"] == "xfail-imperative"
    summary = info["episode_summary"]
    assert summary["resolved"] is False and summary["fail_to_pass"] == "0/2" and summary["pass_to_pass"] == "1/2"
    assert reward == pytest.approx(0.25)


def test_the_report_plugin_tells_a_marked_xfail_from_an_imperative_one(tmp_path):
    from environments.swe.synth import run_suite

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "test_x.py").write_text(
        "import pytest\n\n\n@pytest.mark.xfail(reason='known')\ndef test_marked():\n    assert False\n\n\n"
        "def test_imperative():\n    pytest.xfail('known')\n\n\ndef test_skipped():\n    pytest.skip('later')\n\n\n"
        "def test_ok():\n    pass\n")
    statuses, _ = run_suite(tmp_path / "repo", timeout=60)
    assert statuses == {"test_x.py::test_marked": "xfail", "test_x.py::test_imperative": "xfail-imperative",
                        "test_x.py::test_skipped": "skipped", "test_x.py::test_ok": "passed"}


def test_installed_plugins_load_only_when_asked(tmp_path):
    """Grading and synthesis run pytest without the interpreter's plugins unless named (pytest_plugins)
    or all asked for (pytest_autoload): an asyncio test needs pytest-asyncio."""
    from environments.swe.synth import run_suite

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "test_a.py").write_text(
        "import pytest\n\n\n@pytest.mark.asyncio\nasync def test_async():\n    assert True\n")
    bare, _ = run_suite(tmp_path / "repo", timeout=60)
    named, _ = run_suite(tmp_path / "repo", timeout=60, pytest_plugins=["asyncio"])
    everything, _ = run_suite(tmp_path / "repo", timeout=60, pytest_autoload=True)
    assert bare["test_a.py::test_async"] != "passed"
    assert named["test_a.py::test_async"] == everything["test_a.py::test_async"] == "passed"


async def test_grading_loads_installed_plugins_only_when_asked(tmp_path):
    """The sandboxed grader (process backend): an asyncio test fails without pytest-asyncio, passes with
    pytest_plugins=["asyncio"] or pytest_autoload=True."""
    from environments.swe import base_checkout, grade, parse_task
    from forge_env.workspace import Snapshot
    from tests.swe_support import git

    repo = tmp_path / "acme__aio"
    (repo / "aio").mkdir(parents=True)
    (repo / "aio" / "__init__.py").write_text("async def one():\n    return 2\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests").mkdir()
    (repo / "tests" / "test_aio.py").write_text("import pytest\nfrom aio import one\n\n\n@pytest.mark.asyncio\n"
                                               "async def test_one():\n    assert await one() == 1\n")
    git(repo, "add", "-N", "tests/test_aio.py")
    test_patch = git(repo, "diff")
    task = parse_task({"instance_id": "aio-1", "repo": "acme/aio", "base_commit": base, "problem_statement": "x",
                       "patch": "(not used here)", "test_patch": test_patch, "FAIL_TO_PASS": ["tests/test_aio.py::test_one"],
                       "PASS_TO_PASS": []})
    checkout = base_checkout(task, tmp_path)
    fixed = Snapshot({"aio/__init__.py": b"async def one():\n    return 1\n"}, [], [], [])
    box = swe_test_sandbox("process", ("pytest-asyncio",))  # the plugin, allow-listed into the interpreter
    try:
        results = [await grade(box, task, checkout, fixed, timeout=60, **options)
                   for options in ({}, {"pytest_plugins": ["asyncio"]}, {"pytest_autoload": True})]
    finally:
        await box.close()
    assert [r.statuses["tests/test_aio.py::test_one"] == "passed" for r in results] == [False, True, True]
    assert [r.resolved for r in results] == [False, True, True]
