"""SWE-v0 episodes: the reference patch applied through the tools earns 1, no change 0, a partial fix 0
(fraction mode: the fraction); the tools answer mistakes with errors the model can read; the workspace
survives a timeout; a sandbox that cannot start is an InfraError."""

from __future__ import annotations

import pytest

from environments.swe import SWEEnv
from environments.swe.env import SANDBOX_PACKAGES
from forge_env import InfraError
from forge_env.sandbox import make_sandbox
from tests.swe_support import (
    FIXED_OPS,
    OPS,
    SWE_BACKENDS,
    call,
    mirror_in,
    play,
    swe_sandbox,
)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return mirror_in(tmp_path_factory)


@pytest.fixture(scope="module", params=SWE_BACKENDS)
def sandbox(request):
    yield from swe_sandbox(request.param)


@pytest.fixture
def env(mirror, sandbox):
    repos, row = mirror
    made = SWEEnv([row], repos_dir=repos, sandbox=sandbox, bash_timeout=5, grading_timeout=60)
    yield made
    made.close()


async def test_reference_patch_through_bash_git_apply_resolves(env, mirror):
    _, row = mirror
    apply = call("bash", command=f"git apply - <<'EOF'\n{row['patch']}EOF\ngit diff --stat")
    reward, info, outputs = await play(env, row, apply)
    assert "1 file changed" in outputs[0]
    assert reward == 1.0
    summary = info["episode_summary"]
    assert summary["resolved"] is True and summary["fail_to_pass"] == "2/2" and summary["pass_to_pass"] == "2/2"
    assert summary["dropped"] == {} and env.state.verdict.seconds > 0 and "grading_s" not in summary


async def test_reference_fix_through_edit_resolves_and_no_change_does_not(env, mirror):
    _, row = mirror
    edits = [call("edit", path="calc/ops.py", old_str="(len(xs) - 1)", new_str="len(xs)"),
             call("edit", path="calc/ops.py", old_str="min(xs) + 1", new_str="min(xs)"),
             call("view", path="calc/ops.py", start_line=17, end_line=22)]
    reward, info, outputs = await play(env, row, *edits)
    assert reward == 1.0, info
    assert "return sum(xs) / len(xs)" in outputs[0] and "max(xs) - min(xs)\n" in outputs[2] + "\n"
    reward, info, _ = await play(env, row)
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "0/2"
    assert info["episode_summary"]["pass_to_pass"] == "2/2"


async def test_partial_fix_is_zero_resolved_and_the_fraction_in_fraction_mode(mirror, sandbox):
    repos, row = mirror
    partial = call("create", path="calc/ops.py", content=OPS.replace("(len(xs) - 1)", "len(xs)"))
    resolved = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60)
    fraction = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, reward_mode="fraction")
    reward, info, _ = await play(resolved, row, partial)
    assert reward == 0.0 and info["episode_summary"]["fail_to_pass"] == "1/2"
    reward, info, _ = await play(fraction, row, partial)
    assert reward == pytest.approx(0.75) and info["metrics"]["pass_fraction"] == pytest.approx(0.75)


async def test_a_turn_without_tool_calls_ends_and_grades(env, mirror):
    _, row = mirror
    await env.areset(options={"task": row})
    await env.astep(call("create", path="calc/ops.py", content=FIXED_OPS))
    _, reward, terminated, _, info = await env.astep("I fixed it.")
    assert terminated and reward == 1.0 and info["episode_summary"]["resolved"] is True


async def test_tool_mistakes_are_error_observations_and_the_workspace_survives_a_timeout(env, mirror):
    _, row = mirror
    turns = [call("bash", command="echo kept > note.txt"),
             call("bash", command="sleep 30"),
             call("bash", command="cat note.txt; exit 3"),
             call("edit", path="calc/ops.py", old_str="return", new_str="return"),
             call("edit", path="calc/missing.py", old_str="a", new_str="b"),
             call("view", path="nope.py"),
             call("view", path="calc")]
    reward, info, outputs = await play(env, row, *turns, submit=True)
    assert "timed out after 5s" in outputs[1]
    assert "kept" in outputs[2] and "[exit code 3]" in outputs[2]
    assert "occurs 6 times" in outputs[3] and "exactly once" in outputs[3]
    assert "does not exist" in outputs[4] and "does not exist" in outputs[5]
    assert outputs[6].splitlines() == ["__init__.py", "ops.py"]
    assert reward == 0.0 and info["tool_errors"] == 3


async def test_workspace_that_cannot_start_is_infra_error(mirror):
    repos, row = mirror
    box = make_sandbox("process", isolation="bwrap", max_concurrency=1, packages=SANDBOX_PACKAGES)
    await box.close()
    env = SWEEnv([row], repos_dir=repos, sandbox=box)
    with pytest.raises(InfraError, match="could not start a session"):
        await env.areset(options={"task": row})


def test_registered_with_the_bundled_tasks_by_default(sandbox):
    import forge_env
    env = forge_env.make("forge_env/SWE-v0", sandbox=sandbox)
    assert len(env.tasks) == 12 and all(t["repo"] == "local/tinylib" for t in env.tasks)
    spec_names = [tool.name for tool in env.episode_tools(type("S", (), {"data": {}})())]
    assert spec_names == ["bash", "view", "edit", "create", "submit"]


async def test_spare_sessions_started_before_a_path_was_hidden_are_not_handed_out(sandbox, tmp_path):
    import asyncio

    from forge_env.sandbox import hide_from_sandboxes
    from forge_env.workspace import Spares
    spares = Spares(sandbox, 1)
    spares.refill()
    old = spares._ready[0][1]
    await asyncio.wrap_future(old)
    (tmp_path / "answers.jsonl").write_text("{}")
    hide_from_sandboxes(tmp_path / "answers.jsonl")
    assert spares.take() is None  # the old one is discarded (and closed), a new one is starting
    fresh = spares.take()
    assert fresh is not None and fresh is not old
    session = await asyncio.wrap_future(fresh)
    assert "ready" in (await session.run('_reply({"ok": "ready"})')).stdout
    await session.close()
    spares.close()


async def test_an_episode_cut_by_max_turns_is_graded_as_it_stands(mirror, sandbox):
    """SWE-bench grades whatever patch exists: the fix made before the turn limit earns its reward."""
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, max_turns=2, spare_sessions=0)
    try:
        await env.areset(options={"task": row})
        *_, terminated, truncated, _ = await env.astep(call("create", path="calc/ops.py", content=FIXED_OPS))
        assert not (terminated or truncated)
        _, reward, terminated, truncated, info = await env.astep(call("bash", command="git diff --stat"))
    finally:
        await env.aclose()
    assert truncated and not terminated and info["truncation_reason"] == "max_turns"
    assert reward == 1.0 and info["metrics"]["resolved"] == 1.0
    summary = info["episode_summary"]
    assert summary["resolved"] is True and summary["fail_to_pass"] == "2/2" and summary["return"] == 1.0


async def test_grade_truncated_false_leaves_a_cut_episode_ungraded_and_submit_on_the_last_turn_finishes(
        mirror, sandbox):
    repos, row = mirror
    fix = call("create", path="calc/ops.py", content=FIXED_OPS)
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, max_turns=2, spare_sessions=0,
                 grade_truncated=False)
    try:
        await env.areset(options={"task": row})
        await env.astep(fix)
        _, reward, terminated, truncated, info = await env.astep(call("bash", command="true"))
        assert truncated and reward == 0.0 and "resolved" not in info["episode_summary"]
        assert "grade" not in env.state.data
    finally:
        await env.aclose()
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, grading_timeout=60, max_turns=2, spare_sessions=0)
    try:
        reward, info, _ = await play(env, row, fix)  # the submit is turn 2, the last
    finally:
        await env.aclose()
    assert reward == 1.0 and info["episode_summary"]["resolved"] is True and "truncation_reason" not in info


async def test_the_agents_pytest_loads_the_plugins_grading_loads(mirror, sandbox):
    repos, row = mirror
    show = call("bash", command="env | grep ^PYTEST_ | sort")
    outputs = {}
    for options in ({}, {"pytest_plugins": ["asyncio", "timeout"]}, {"pytest_autoload": True}):
        env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, spare_sessions=0, **options)
        try:
            _, _, seen = await play(env, row, show, submit=False)
        finally:
            await env.aclose()
        outputs[str(options)] = seen[0]
    assert list(outputs.values()) == ["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
                                      "PYTEST_ADDOPTS=-p asyncio -p timeout\nPYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
                                      "(no output)"]
    with pytest.raises(ValueError, match="pytest_plugins"):
        SWEEnv([row], repos_dir=repos, sandbox=sandbox, pytest_plugins=["asyncio -p evil"])


async def test_the_workspace_python_has_the_sandbox_interpreters_packages(mirror, sandbox):
    """python, python3 and pytest in the workspace: the sandbox's interpreter and its packages; over a
    virtualenv, a lean one in the home directory (the packages without their .pth import hooks)."""
    import sys
    repos, row = mirror
    env = SWEEnv([row], repos_dir=repos, sandbox=sandbox, spare_sessions=0)
    script = ("import sys, pytest; print(pytest.__name__, sys.prefix == sys.base_prefix, "
              "sys.prefix.endswith('/home'))")
    try:
        _, _, seen = await play(env, row, call("bash", command=f'python -c "{script}"; python3 -c "{script}"'),
                                call("bash", command="pytest -q tests/test_ops.py 2>&1 | tail -1"), submit=False)
    finally:
        await env.aclose()
    venv = sandbox.isolation != "docker" and sys.prefix != sys.base_prefix
    assert seen[0] == "\n".join([f"pytest {not venv} {venv}"] * 2)
    assert seen[1].startswith("2 passed")
