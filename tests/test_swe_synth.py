"""Task synthesis by mutation: every produced task is solved by its own patch and not by the empty patch,
on the bundled repository and on one the test builds; synthesis is deterministic with a seed."""

from __future__ import annotations

import json

import pytest

from environments.swe import SWEEnv, base_checkout, grade, load_swe_tasks
from environments.swe.bundled import bundled_tasks
from environments.swe.mutate import mutations
from environments.swe.synth import SynthesisError, synthesize
from forge_env.workspace import Snapshot
from tests.swe_support import FIXED_OPS, TEST_OPS, call, play, swe_test_sandbox


@pytest.fixture(scope="module")
def sandbox():
    """Synthesis is checked on the process backend (the env suites cover both)."""
    box = swe_test_sandbox("process")
    yield box
    import asyncio
    asyncio.run(box.close())


def snapshot_of(patch: str, checkout, tmp_path) -> Snapshot:
    """The snapshot a workspace would give after ``git apply patch``."""
    import subprocess
    root = tmp_path / "apply"
    root.mkdir(exist_ok=True)
    for path, data in checkout.files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    subprocess.run(["git", "apply", "-"], cwd=root, input=patch.encode(), check=True)
    changed = {p: (root / p).read_bytes() for p in checkout.files if (root / p).read_bytes() != checkout.files[p]}
    return Snapshot(changed, [], [], [])


async def check_solvable(tasks, repos, sandbox, tmp_path):  # noqa: F811
    for task in tasks:
        checkout = base_checkout(task, repos)
        assert not set(task.fail_to_pass) & {f"{p}::x" for p in checkout.files}  # hidden tests are not in base
        solved = await grade(sandbox, task, checkout, snapshot_of(task.patch, checkout, tmp_path), timeout=60)
        empty = await grade(sandbox, task, checkout, Snapshot({}, [], [], []), timeout=60)
        assert solved.resolved, (task.instance_id, solved.statuses, solved.output_tail)
        assert not empty.resolved and empty.passed(task.fail_to_pass) == 0, (task.instance_id, empty.statuses)


@pytest.fixture(scope="module")
def calc_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("calcrepo") / "calc"
    (root / "calc").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "calc" / "__init__.py").write_text("")
    (root / "calc" / "ops.py").write_text(FIXED_OPS)
    (root / "tests" / "test_ops.py").write_text(TEST_OPS + "\n\nfrom calc.ops import mean, span\n\n\n"
                                                "def test_mean():\n    assert mean([1, 2, 3]) == 2\n\n\n"
                                                "def test_span():\n    assert span([1, 5, 2]) == 4\n")
    return root


async def test_synthesis_on_a_repository_the_test_builds(calc_repo, tmp_path, sandbox):  # noqa: F811
    repos = tmp_path / "repos"
    rows = synthesize(calc_repo, repos, seed=3, max_tasks=2, max_tries=10, timeout=60, progress=False)
    assert rows, "no mutant kept"
    from agents.cli import main  # the same through `forge-env tasks synth`
    out = tmp_path / "cli" / "tasks.jsonl"
    out.parent.mkdir()
    assert main(["tasks", "synth", str(calc_repo), "--out", str(out), "--seed", "3", "--max-tasks", "2",
                 "--max-tries", "10"]) == 0
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert again[0]["repo_path"] == str(tmp_path / "cli" / "repos" / "local__calc")
    assert [(r["base_commit"], r["patch"]) for r in again] == [(r["base_commit"], r["patch"]) for r in rows]
    for row in rows:
        assert row["repo"] == "local/calc" and row["FAIL_TO_PASS"] and row["PASS_TO_PASS"]
        assert "tests/test_ops.py" in row["test_patch"] and "calc/ops.py" in row["patch"]
        for line in row["patch"].splitlines():
            if line.startswith("+") and not line.startswith("+++"):
                assert line[1:].strip() not in row["problem_statement"]  # the fix is never in the statement
    await check_solvable(load_swe_tasks(rows), repos, sandbox, tmp_path)
    # and through an episode, as a model would: git apply in the workspace
    env = SWEEnv(rows[:1], repos_dir=repos, sandbox=sandbox, grading_timeout=60)
    reward, _, _ = await play(env, rows[0], call("bash", command=f"git apply - <<'EOF'\n{rows[0]['patch']}EOF"))
    assert reward == 1.0
    env.close()


async def test_bundled_tasks_are_each_solvable_by_their_patch_only(sandbox, tmp_path):  # noqa: F811
    rows, repos = bundled_tasks()
    assert len(rows) >= 10
    await check_solvable(load_swe_tasks(rows), repos, sandbox, tmp_path)


def test_synthesis_needs_a_passing_suite(tmp_path, calc_repo):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(calc_repo, broken)
    (broken / "calc" / "ops.py").write_text(FIXED_OPS.replace("a + b", "a - b"))
    with pytest.raises(SynthesisError, match="must pass before mutating.*test_add"):
        synthesize(broken, tmp_path / "repos", max_tries=1, progress=False)


FLAKY_TEST = """from pathlib import Path

COUNTER = Path(__COUNTER__)


def test_alternates():
    n = int(COUNTER.read_text()) if COUNTER.exists() else 0
    COUNTER.write_text(str(n + 1))
    assert n % 2 == 0  # passes on the suite's 1st, 3rd, ... run, fails on the others: flaky, deterministically
"""


def test_synthesis_drops_a_flaky_test_and_says_so(tmp_path, calc_repo, capsys):
    """Issue 47 item 6: a test whose outcome varies over the suite's runs is never FAIL_TO_PASS or PASS_TO_PASS
    (a correct fix would otherwise earn 0 by chance); the row and the command's output say how many."""
    import shutil

    from agents.cli import main
    repo = tmp_path / "flaky"
    shutil.copytree(calc_repo, repo)
    (repo / "tests" / "test_flaky.py").write_text(FLAKY_TEST.replace("__COUNTER__", repr(str(tmp_path / "counter"))))
    out = tmp_path / "tasks.jsonl"
    assert main(["tasks", "synth", str(repo), "--out", str(out), "--seed", "3", "--max-tasks", "1",
                 "--max-tries", "10"]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows, "no mutant kept"
    flaky = "tests/test_flaky.py::test_alternates"
    for row in rows:
        assert flaky not in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"], row
        assert row["FAIL_TO_PASS"] and row["PASS_TO_PASS"]
        assert (row["flaky_dropped"], row["validation_runs"]) == (1, 3)
    assert "1 flaky test(s) dropped" in printed, printed


def test_mutation_operators_touch_one_place():
    source = "def f(a, b):\n    x = a + b\n    if a < b and b > 0:\n        return g(a, b)\n    return x - 1\n"
    kinds = {}
    for mutation in mutations("f.py", source):
        mutated = mutation.apply(source)
        assert mutated != source
        kinds.setdefault(mutation.kind, mutated)
    assert set(kinds) == {"flip_comparison", "wrong_operator", "wrong_boolean", "off_by_one", "swap_arguments",
                          "drop_statement"}
    assert "return g(b, a)" in kinds["swap_arguments"]
