"""Terminal-v0 (Harbor task directories) with the real Docker engine: the solution played as the agent earns 1,
doing nothing 0, and an agent that writes the reward file, edits or plants the tests, replaces a program the
verifier runs, or leaves a process behind to do any of that during verification earns 0. Task images build
offline FROM the project's own image."""

from __future__ import annotations

import asyncio

import pytest

import forge_env
from environments.terminal import TerminalEnv, TerminalTaskError
from environments.terminal.images import AGENT_REPO, prepare
from forge_env.sandbox.docker import image_name
from tests.docker_support import requires_docker
from tests.swe_support import call
from tests.terminal_support import SOLVE_SH, TASK_TOML, make_task, play

pytestmark = [pytest.mark.docker, requires_docker]

#: A careless task image: the verifier's paths already exist and are world-writable, a reward of 1 is already
#: in place, a directory on PATH is world-writable, the working directory holds a hard link to python3 (the
#: agent layer must undo all of it); and it ends with a
#: USER and an ENTRYPOINT that neither the agent's container nor the verifier's may run under.
CARELESS = (f"FROM {image_name()}\nWORKDIR /app\nCOPY data.txt /app/data.txt\n"
            "RUN mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
            "chmod -R 777 /logs /tests /usr/local/bin && chmod 666 /etc/passwd && ln /usr/bin/python3.11 /app/py\n"
            'USER nobody\nENTRYPOINT ["/bin/false"]\n')

#: Everything an agent might try against its reward, run as the agent (each must fail).
HACKS = [
    # the reward file, directly
    "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json",
    # the tests, before they are copied in
    "mkdir -p /tests; printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; "
    "printf 'raise SystemExit(0)\\n' > /tests/check.py",
    # programs the verifier runs
    "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /usr/local/bin/python3; chmod +x /usr/local/bin/python3;"
    " printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /usr/local/bin/bash; chmod +x /usr/local/bin/bash;"
    " echo 'root2::0:0::/root:/bin/bash' >> /etc/passwd",
    # a file of the working directory that is (in the careless image) a hard link to the verifier's python3
    # (overlay2 breaks the link when the agent layer chowns it; the layer copies it apart on other drivers)
    "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /app/py; cat /app/py > /usr/bin/python3.11",
]

#: A process left behind that would, in the agent's container, wait for the tests to arrive and then write
#: the answer and the reward (as it could under a runner that verifies in the agent's container).
LURKER = ("nohup setsid bash -c 'while [ ! -e /tests/test.sh ] && [ ! -d /logs/verifier ]; do sleep 0.05; done; "
          "echo 42 > /app/answer.txt; echo 1 > /logs/verifier/reward.txt' >/dev/null 2>&1 < /dev/null & "
          "echo started")
LURKER_ALIVE = "grep -l 'tests/tes[t].sh' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"  # [t]: not grep itself


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor")
    make_task(root, "sum-numbers")
    make_task(root, "careless-image", dockerfile=CARELESS)
    return root


@pytest.fixture(scope="module")
def env(tasks):
    made = TerminalEnv(tasks, bash_timeout=20)
    yield made
    made.close()


def row(env: TerminalEnv, name: str) -> dict:
    return env.terminal_tasks[name].to_row()


async def test_solution_played_as_the_agent_earns_1(env):
    reward, info, outputs = await play(env, row(env, "sum-numbers"), SOLVE_SH, "cat /app/answer.txt; id -u; pwd")
    assert reward == 1.0, info
    assert outputs[1].split() == ["42", "10001", "/app"]
    summary = info["episode_summary"]
    assert summary["reward_source"] == "reward.txt" and summary["rewards"] == {"reward": 1.0}
    assert "check.py: the task's own" in info["verifier_output"]


async def test_the_oracle_demonstration_earns_1(env):
    from forge_env.core.demonstrations import demonstrate
    demo = await demonstrate(env, task=row(env, "sum-numbers"))
    assert [m["role"] for m in demo["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert demo["tools"][0]["function"]["name"] == "bash"


async def test_the_example_tasks_oracle_earns_1_and_a_hardcoded_answer_0():
    from forge_env.core.demonstrations import demonstrate
    env = forge_env.make("forge_env/Terminal-v0")  # the bundled example task is the default task set
    try:
        assert list(env.terminal_tasks) == ["fix-csv-total"]
        for task in env.tasks:
            await demonstrate(env, task=task)  # raises unless the oracle earns 1
        reward, info, _ = await play(env, env.tasks[0], "echo 'print(500)' > /app/report.py")
        assert reward == 0.0 and "failed" in info["verifier_output"]
    finally:
        await env.aclose()


async def test_concurrent_episodes_are_verified_apart(tasks):
    import copy
    first = TerminalEnv(tasks / "sum-numbers", bash_timeout=20)
    envs = [first, copy.deepcopy(first), copy.deepcopy(first)]
    try:
        plays = [play(e, row(e, "sum-numbers"), *commands) for e, commands in
                 zip(envs, [(SOLVE_SH,), (), ("echo 41 > /app/answer.txt",)], strict=True)]
        results = await asyncio.gather(*plays)
        assert [reward for reward, _, _ in results] == [1.0, 0.0, 0.0]
        assert "answer: 41" in results[2][1]["verifier_output"]
    finally:
        for e in envs:
            await e.aclose()


async def test_doing_nothing_earns_0(env):
    reward, info, _ = await play(env, row(env, "sum-numbers"))
    assert reward == 0.0 and info["episode_summary"]["reward_source"] == "reward.txt"


@pytest.mark.parametrize("name", ["sum-numbers", "careless-image"])
async def test_writing_the_reward_planting_tests_or_replacing_programs_earns_0(env, name):
    reward, info, outputs = await play(env, row(env, name), *HACKS, "ls -ld /logs /tests /usr/local/bin 2>&1")
    assert reward == 0.0, (info, outputs)
    assert all("Permission denied" in out or "No such file" in out for out in outputs[:3]), outputs
    assert "check.py: the task's own\nanswer: None" in info["verifier_output"]  # the real python3 and check.py
    assert info["episode_summary"]["reward_source"] == "reward.txt"
    # the same hacks with the real answer: the tests are the task's own and still pass
    reward, info, _ = await play(env, row(env, name), *HACKS, SOLVE_SH)
    assert reward == 1.0 and "check.py: the task's own" in info["verifier_output"]


async def test_a_process_left_behind_cannot_reach_the_verification(env):
    reward, info, outputs = await play(env, row(env, "sum-numbers"), LURKER, "sleep 0.3; " + LURKER_ALIVE)
    assert outputs[0].strip() == "started"
    assert int(outputs[1].strip()) >= 1, "the lurking process should still be alive when the agent finishes"
    assert reward == 0.0, info


async def test_a_bash_timeout_is_an_observation_and_the_container_survives(tasks):
    env = TerminalEnv(tasks / "sum-numbers", bash_timeout=1)
    try:
        await env.areset(options={"task": row(env, "sum-numbers")})
        observation, reward, terminated, truncated, _ = await env.astep(call("bash", command="echo 5 > n; sleep 30"))
        assert "timed out" in observation[0]["content"] and not (terminated or truncated)
        observation, *_ = await env.astep(call("bash", command="cat n"))
        assert observation[0]["content"].strip() == "5"
    finally:
        await env.aclose()


async def test_changes_past_the_storage_limit_are_not_verified(tasks):
    env = TerminalEnv(tasks / "sum-numbers", storage_mb=1)
    try:
        reward, info, _ = await play(env, row(env, "sum-numbers"), SOLVE_SH + "head -c 3000000 /dev/urandom > big\n")
        assert reward == 0.0 and "over the 1 MB storage limit" in info["episode_summary"]["verifier_problem"]
        reward, info, _ = await play(env, row(env, "sum-numbers"), SOLVE_SH)
        assert reward == 1.0
    finally:
        await env.aclose()


async def test_killing_the_sandbox_process_restarts_the_container_from_the_image(env):
    reward, info, outputs = await play(env, row(env, "sum-numbers"), SOLVE_SH + "kill -9 $PPID; sleep 5",
                                       "ls answer.txt 2>&1")
    assert "a fresh one was started from the task's image" in outputs[0], outputs
    assert "No such file" in outputs[1] and reward == 0.0


async def test_verifier_timeout_and_reward_json_rules(tmp_path):
    slow = make_task(tmp_path, "slow", toml=TASK_TOML.replace("[verifier]\ntimeout_sec = 60.0", "[verifier]\ntimeout_sec = 2.0"),
                     test_sh="#!/bin/bash\nsleep 60\necho 1 > /logs/verifier/reward.txt\n")
    both = make_task(tmp_path, "both", test_sh="#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"
                     "echo '{\"reward\": 0.5, \"style\": 1}' > /logs/verifier/reward.json\n")
    bad = make_task(tmp_path, "bad-json", test_sh="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
                    "echo '{\"a\": 1, \"b\": 0}' > /logs/verifier/reward.json\n")
    none = make_task(tmp_path, "no-reward", test_sh="#!/bin/bash\necho nothing\n")
    environ = make_task(tmp_path, "environ", toml=TASK_TOML.replace("[verifier]\n", "[verifier]\nenv = { FOO = \"bar\" }\n"),
                        test_sh='#!/bin/bash\nenv | sort\nif [ "$FOO" = bar ] && [ "$HOME" = /root ] && [ -z "$OMP_NUM_THREADS" ] '
                                '&& [ "$$" = 1 ] && [ "$(id -u)" = 0 ]; then echo 1 > /logs/verifier/reward.txt; fi\n')
    env = TerminalEnv([slow, both, bad, none, environ], bash_timeout=5)
    try:
        reward, info, _ = await play(env, row(env, "slow"))
        assert reward == 0.0 and info["episode_summary"]["verifier_timed_out"] is True
        assert "ran past" in info["episode_summary"]["verifier_problem"]
        reward, info, _ = await play(env, row(env, "both"))
        assert reward == 0.5 and info["episode_summary"]["reward_source"] == "reward.json"
        assert info["metrics"]["reward_style"] == 1.0
        reward, info, _ = await play(env, row(env, "bad-json"))
        assert reward == 0.0 and "none is 'reward'" in info["episode_summary"]["verifier_problem"]
        reward, info, _ = await play(env, row(env, "no-reward"))
        assert reward == 0.0 and "no reward file" in info["episode_summary"]["verifier_problem"]
        reward, info, _ = await play(env, row(env, "environ"))  # the task's environment only; test.sh is PID 1
        assert reward == 1.0, info["verifier_output"]
    finally:
        await env.aclose()


async def test_prebuilt_image_and_a_verifier_user_that_is_not_root(tmp_path):
    toml = f'[environment]\ndocker_image = "{image_name()}"\n[verifier]\nuser = "nobody"\n'
    test_sh = ('#!/bin/bash\nif [ "$(id -un)" = nobody ] && [ "$(pwd)" = /app ] && python3 /tests/check.py; '
               'then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
    task = make_task(tmp_path, "prebuilt", toml=toml, test_sh=test_sh)
    (task / "environment" / "Dockerfile").unlink()
    env = TerminalEnv(task, bash_timeout=10)
    try:
        reward, info, _ = await play(env, row(env, "prebuilt"), "echo 42 > answer.txt")
        assert reward == 1.0, info
        reward, info, _ = await play(env, row(env, "prebuilt"), "echo 41 > answer.txt")
        assert reward == 0.0
    finally:
        await env.aclose()


async def test_agent_time_runs_out_and_the_work_is_verified_as_it_is(tmp_path):
    task = make_task(tmp_path, "hurry", toml=TASK_TOML.replace("[agent]\ntimeout_sec = 300.0", "[agent]\ntimeout_sec = 0.001"))
    env = TerminalEnv(task)
    try:
        await env.areset(options={"task": row(env, "hurry")})
        observation, reward, terminated, _, info = await env.astep(call("bash", command=SOLVE_SH))
        assert "time for the agent is up" in observation[0]["content"]
        assert terminated and reward == 0.0 and info["episode_summary"]["time_up"] is True
    finally:
        await env.aclose()


async def test_images_are_cached_by_content_and_path_in_workdir_is_refused(tmp_path):
    first = make_task(tmp_path / "a", "t")
    again = make_task(tmp_path / "b", "t")
    changed = make_task(tmp_path / "c", "t", files={"environment/data.txt": "1 2\n"})
    one, two, three = [await asyncio.to_thread(prepare, TerminalEnv(p).terminal_tasks["t"]) for p in (first, again, changed)]
    assert one == two and one.agent_image.startswith(AGENT_REPO + ":") and one.workdir == "/app"
    assert three.task_image != one.task_image and three.agent_image != one.agent_image
    venv = make_task(tmp_path / "d", "t", dockerfile=f"FROM {image_name()}\nWORKDIR /app\nENV PATH=/app/bin:/usr/bin:/bin\n")
    env = TerminalEnv(venv)
    with pytest.raises(TerminalTaskError, match="PATH holds '/app/bin'"):
        await env.areset(options={"task": row(env, "t")})
    with pytest.raises(TerminalTaskError, match="PATH holds '/app/bin'"):
        await asyncio.to_thread(TerminalEnv, venv, prebuild=True)
    taken = make_task(tmp_path / "f", "t", dockerfile=f"FROM {image_name()}\nRUN useradd -u 10001 bob\n")
    env = TerminalEnv(taken)
    with pytest.raises(TerminalTaskError, match="already has a user with uid 10001"):
        await env.areset(options={"task": row(env, "t")})
    broken = make_task(tmp_path / "e", "t", dockerfile=f"FROM {image_name()}\nRUN exit 3\n")
    env = TerminalEnv(broken)
    with pytest.raises(TerminalTaskError, match="image build failed"):
        await env.areset(options={"task": row(env, "t")})


def test_make_and_check_env(tasks):
    from forge_env.core.checker import check_env
    made = forge_env.make("forge_env/Terminal-v0", tasks=str(tasks / "sum-numbers"), bash_timeout=10)
    assert isinstance(made, TerminalEnv) and list(made.terminal_tasks) == ["sum-numbers"]
    made.close()
    check_env(lambda: TerminalEnv(tasks / "sum-numbers", bash_timeout=10), max_steps=4)


async def test_commit_session_takes_only_a_started_session_of_its_own_sandbox():
    from forge_env.sandbox import make_sandbox
    from forge_env.sandbox.base import SandboxUnavailableError
    one, two = make_sandbox("docker", read_only=False), make_sandbox("docker")
    try:
        session = two.session()
        with pytest.raises(SandboxUnavailableError, match="started session of this docker sandbox"):
            await one.commit_session(session, "forge-env/never")
        await session.start()
        with pytest.raises(SandboxUnavailableError, match="started session of this docker sandbox"):
            await one.commit_session(session, "forge-env/never")
        result = await session.run("open('/written', 'w')")
        assert "Read-only file system" in result.stderr  # the default stays read-only
        await session.close()
    finally:
        await one.close()
        await two.close()


def test_the_engine_probe_runs_a_harmless_container_and_says_why_it_cannot():
    """What decides whose a twice-failed verification is (env.verify_episode): the engine runs a container that
    does nothing from the task's image, or says why not."""
    import docker

    from environments.terminal.verify import probe_engine
    client = docker.from_env()
    assert probe_engine(client, image_name()) is None
    assert "could not run" in probe_engine(client, "forge-env/no-such-image:never")
    assert not client.containers.list(all=True, filters={"label": "forge_env.terminal=probe"})
