"""SWE-v0 task loading: SWE-bench rows from files, lists and datasets; bad rows and missing mirrors fail at load."""

from __future__ import annotations

import json

import pytest

from environments.swe import SWETaskError, base_checkout, check_repo, load_swe_tasks, parse_task
from tests.swe_support import FAIL_TO_PASS, make_mirror, mirror_in


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return mirror_in(tmp_path_factory)


def test_rows_load_from_jsonl_json_list_and_dataset(mirror, tmp_path):
    repos, row = mirror
    published = dict(row, FAIL_TO_PASS=json.dumps(row["FAIL_TO_PASS"]), PASS_TO_PASS=json.dumps(row["PASS_TO_PASS"]))
    (tmp_path / "t.jsonl").write_text(json.dumps(published) + "\n\n")
    (tmp_path / "t.json").write_text(json.dumps([row]))
    import datasets  # a dependency of forge-env: missing, this fails, not a skip

    sources = [tmp_path / "t.jsonl", str(tmp_path / "t.json"), [row], datasets.Dataset.from_list([published])]
    for source in sources:
        [task] = load_swe_tasks(source)
        assert task.fail_to_pass == tuple(FAIL_TO_PASS) and task.test_cmd == "pytest"
        assert check_repo(task, repos) == repos / "acme__calc"


@pytest.mark.parametrize("change, message", [
    ({"base_commit": None}, "missing field(s) ['base_commit']"),
    ({"FAIL_TO_PASS": "[not json"}, "'FAIL_TO_PASS' is a string but not a JSON list"),
    ({"PASS_TO_PASS": [1]}, "'PASS_TO_PASS' must be a list of test ids"),
    ({"FAIL_TO_PASS": []}, "'FAIL_TO_PASS' is empty"),
    ({"repo": "calc"}, "'repo' must look like 'owner/name'"),
    ({"base_commit": "main~1"}, "'base_commit' must be a hex commit id"),
    ({"test_cmd": "tox"}, "'test_cmd' 'tox' is not supported"),
    ({"patch": ""}, "'patch' must be a non-empty string"),
])
def test_malformed_rows_name_the_row_and_field(mirror, tmp_path, change, message):
    _, row = mirror
    bad = {k: v for k, v in (row | change).items() if v is not None}
    (tmp_path / "t.jsonl").write_text(json.dumps(row | {"instance_id": "ok"}) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SWETaskError) as caught:
        load_swe_tasks(tmp_path / "t.jsonl")
    assert message in str(caught.value) and "row 1 (acme__calc-1)" in str(caught.value)


def test_missing_repository_or_commit_fails_at_load(mirror, tmp_path):
    repos, row = mirror
    with pytest.raises(SWETaskError, match="not found at .*other__calc"):
        check_repo(parse_task(row | {"repo": "other/calc"}), repos)
    with pytest.raises(SWETaskError, match="base_commit 0123abcd is not in"):
        check_repo(parse_task(row | {"base_commit": "0123abcd"}), repos)
    with pytest.raises(SWETaskError, match="no repos_dir was given"):
        check_repo(parse_task(row), None)
    assert check_repo(parse_task(row | {"repo_path": str(repos / "acme__calc")}), None).is_dir()
    from environments.swe import SWEEnv
    with pytest.raises(SWETaskError, match="not found"):
        SWEEnv([row | {"repo": "other/calc"}], repos_dir=repos, sandbox=object())


def test_base_checkout_holds_base_commit_only(mirror):
    repos, row = mirror
    checkout = base_checkout(parse_task(row), repos)
    assert sorted(checkout.files) == ["README.md", "calc/__init__.py", "calc/ops.py", "tests/test_ops.py"]
    assert "len(xs) - 1" in checkout.files["calc/ops.py"].decode()
    assert checkout.test_paths == {"tests/test_stats.py"}
    assert "def test_mean" in checkout.test_tree["tests/test_stats.py"].decode()
    assert row["fix_commit"].encode() not in checkout.workspace_tar
    bad = parse_task(row | {"test_patch": row["test_patch"].replace("test_stats.py", "test_ops.py")})
    with pytest.raises(SWETaskError, match="test_patch does not apply"):
        base_checkout(bad, repos)


async def test_a_mirror_and_task_file_under_a_bound_directory_are_masked(tmp_path):
    from environments.swe import SWEEnv
    from forge_env.sandbox import make_sandbox
    from tests.swe_support import call, play
    bound = tmp_path / "bound"
    row = make_mirror(bound / "repos")
    (bound / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    sandbox = make_sandbox("process", isolation="bwrap", ro_binds=(str(bound),), max_concurrency=1, packages=("pytest",),
                           workdir_size_mb=64)
    try:
        env = SWEEnv(bound / "tasks.jsonl", repos_dir=bound / "repos", sandbox=sandbox, spare_sessions=0)
        probe = f"ls -A {bound}/repos/acme__calc | wc -l; wc -c < {bound}/tasks.jsonl; ls {bound}"
        _, _, outputs = await play(env, row, call("bash", command=probe))
        assert outputs[0].split()[:2] == ["0", "0"], outputs[0]  # an empty directory, an empty file
    finally:
        await sandbox.close()
