"""Red team of Terminal-v0's verifier boundary, with the real Docker engine: what an agent (a policy after a higher
reward, or after turning its failure into a masked infra episode) can leave behind for the verification.

Holes found and closed here (each test failed before its fix, unless it guards the fix itself):
- a ``bash`` call cut short by the turn's tool time lost the container, and the commit then raised InfraError;
- the commit copied the agent's writable layer whatever its size (sparse files in full, a tar header per path)
  before the storage limit was checked: a disk filled, or a commit past the engine client's 60 s, an InfraError
  (the measurement that now comes first must itself survive paths longer than the host's PATH_MAX);
- a symlink in the working directory into ``/tests`` (the answer key, mounted only for verification), through
  ``/dev/fd``, ``/proc/self/cwd`` or ``/var/tmp``, or hidden in a directory the verifier cannot list, read by the
  tests as the agent's answer;
- a ``[verifier].env`` PATH through the working directory, an empty PATH entry (the current directory), an
  LD_LIBRARY_PATH or BASH_ENV the agent writes;
- the task image's HEALTHCHECK running the agent's script as root beside the tests (it wrote reward.json);
- a VOLUME in the task image (never committed, never locked down);
- one agent holding every process of the shared uid (RLIMIT_NPROC) failed concurrent episodes' calls.
The rest guards attacks that fail today (startup files, a FIFO, a fork bomb, the answer key in the image,
reward files that are not finite numbers or not regular files)."""

from __future__ import annotations

import json
import os
import time

import pytest

from environments.terminal import TerminalEnv, TerminalTaskError, read_rewards
from tests.docker_support import requires_docker
from tests.terminal_support import SOLVE_SH, TASK_TOML, make_task, play

#: check.py of a task whose answer key is a file of tests/: it opens the key first (fd 3), then the answer.
KEY_CHECK = """\
import sys
key = open("/tests/expected.txt")
try:
    answer = open("/app/answer.txt").read().strip()
except OSError as exc:
    answer = repr(exc)
print("answer:", answer)
sys.exit(0 if answer == key.read().strip() else 1)
"""


def row(env: TerminalEnv) -> dict:
    return env.tasks[0]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("redteam")


def test_bash_calls_run_one_at_a_time_with_no_turn_budget(root):
    env = TerminalEnv(make_task(root, "defaults"))
    assert env.parallel_tool_calls is False and env.turn_tool_time_s is None
    with pytest.raises(ValueError, match="one at a time"):
        TerminalEnv(root / "defaults", parallel_tool_calls=True)


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "Infinity", "1e400", ""])
def test_reward_txt_that_is_not_a_finite_number_is_refused(tmp_path, text):
    (tmp_path / "reward.txt").write_text(text + "\n")
    with pytest.raises(ValueError, match="not one number"):
        read_rewards(str(tmp_path))


def test_reward_file_that_is_a_directory_or_a_fifo_is_refused_without_blocking(tmp_path):
    (tmp_path / "reward.json").mkdir()
    with pytest.raises(ValueError, match="regular file"):
        read_rewards(str(tmp_path))
    os.rmdir(tmp_path / "reward.json")
    os.mkfifo(tmp_path / "reward.json")  # opened without blocking, then refused
    with pytest.raises(ValueError, match="regular file"):
        read_rewards(str(tmp_path))


@pytest.mark.docker
@requires_docker
async def test_a_call_cut_by_the_turns_tool_time_is_not_an_infra_error(root):
    env = TerminalEnv(make_task(root, "turn-cut"), bash_timeout=20, turn_tool_time_s=2)
    try:
        reward, info, outputs = await play(env, row(env), SOLVE_SH, "sleep 10")
        assert "this turn's tool time (2 s) ran out" in outputs[1], outputs
        # the container went with the cut call: a fresh one (as the next bash call would get) is verified
        assert reward == 0.0 and info["episode_summary"]["reward_source"] == "reward.txt", info
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
async def test_sparse_files_and_many_paths_are_not_committed(root):
    env = TerminalEnv(make_task(root, "storage"), storage_mb=50, storage_paths=500)
    try:
        # 800 MB that take no disk until a commit writes them out in full (each file under the 256 MB rlimit)
        reward, info, _ = await play(env, row(env), SOLVE_SH + "for i in 1 2 3 4; do truncate -s 200M s$i; done\n")
        problem = info["episode_summary"]["verifier_problem"]
        assert reward == 0.0 and "over the 50 MB storage limit: not committed" in problem, info
        reward, info, _ = await play(env, row(env), SOLVE_SH + "mkdir m && cd m && touch $(seq 1000)\n")
        problem = info["episode_summary"]["verifier_problem"]
        assert reward == 0.0 and "over the storage limit of 500 paths: not committed" in problem, info
        reward, info, _ = await play(env, row(env), SOLVE_SH)  # under both limits
        assert reward == 1.0, info
    finally:
        await env.aclose()


def test_the_layer_walk_reaches_past_path_max_and_stops_at_its_limits(tmp_path):
    from forge_env.sandbox.docker_engine import _walk_layer
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:  # 50 levels of 99-character names: 5000 characters, past PATH_MAX (4096)
        for _ in range(50):
            os.mkdir("d" * 99, dir_fd=fd)
            child = os.open("d" * 99, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
            f.truncate(10 << 20)  # sparse: counted at its apparent size
    finally:
        os.close(fd)
    for i in range(30):
        (tmp_path / f"e{i}").write_bytes(b"x" * 100)
    os.link(tmp_path / "e0", tmp_path / "e0-link")  # a hard link counts once
    assert _walk_layer(str(tmp_path), float("inf"), 1000) == ((10 << 20) + 3000, 50 + 1 + 31)
    size, paths = _walk_layer(str(tmp_path), float("inf"), 10)
    assert 10 < paths <= 32  # stopped once past the limit, without listing the rest
    assert _walk_layer(str(tmp_path), 1 << 20, 1000)[0] > 1 << 20


@pytest.mark.docker
@requires_docker
def test_the_engines_measure_agrees_and_a_path_past_path_max_is_unmeasurable_not_an_engine_failure():
    """Where the layer cannot be read on this machine the engine measures it; its walk fails on a path longer
    than the host's PATH_MAX, which the code in the container made: a ValueError (not verified), never infra."""
    import docker as sdk

    from forge_env.sandbox.docker import image_name
    from forge_env.sandbox.docker_engine import layer_usage
    client = sdk.from_env()
    script = ("import os, sys, time\nos.makedirs('/data/a'); open('/data/a/f', 'wb').truncate(5 << 20)\n"
              "if sys.argv[1] == 'deep':\n  os.chdir('/data')\n  for i in range(45):\n"
              "    os.mkdir('d' * 99); os.chdir('d' * 99)\nprint('ready', flush=True); time.sleep(300)\n")
    for kind in ("shallow", "deep"):
        container = client.containers.run(image_name(), ["python3", "-c", script, kind], detach=True,
                                          network_mode="none")
        try:
            for _ in range(100):
                if b"ready" in container.logs():
                    break
                time.sleep(0.1)
            client.api.pause(container.id)
            host = layer_usage(client.api, container.id, float("inf"), 10_000, 60)
            if kind == "shallow":
                assert host[0] == 5 << 20 and host == layer_usage(client.api, container.id, float("inf"), 10_000, 60,
                                                                  local=False)
            else:
                assert host[1] == 3 + 45  # /data, /data/a, /data/a/f and the 45 levels
                with pytest.raises(ValueError, match="could not measure"):
                    layer_usage(client.api, container.id, float("inf"), 10_000, 60, local=False)
        finally:
            container.remove(force=True, v=True)


@pytest.mark.docker
@requires_docker
async def test_paths_longer_than_the_hosts_path_max_are_committed(root):
    """The measurement before the commit reads the layer on the host, where the agent's deepest path is longer
    still: it must neither fail (an InfraError) nor refuse."""
    deep = "python3 -c \"import os\nfor i in range(45):\n  os.mkdir('d' * 99); os.chdir('d' * 99)\n\""
    env = TerminalEnv(make_task(root, "deep"), bash_timeout=20)
    try:
        reward, info, _ = await play(env, row(env), SOLVE_SH + deep + "\n")
        assert reward == 1.0, info
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
@pytest.mark.parametrize("plant", [
    "ln -s /tests/expected.txt answer.txt",  # the answer key, mounted only for verification
    "ln -s ../../tests/expected.txt /var/tmp/k && ln -s /var/tmp/k answer.txt",  # relative, through /var/tmp
    "ln -s /dev/fd/3 answer.txt",  # whatever the reading process opened first (the key)
    "mkdir -p d && ln -s /proc/self/cwd/../tests d/t && ln -s d/t/expected.txt answer.txt",
    "ln -s /logs/verifier/reward.json log.txt",  # a test writing its log there would write the reward
])
async def test_a_symlink_to_the_answer_key_is_not_verified(root, plant):
    name = "key-" + str(abs(hash(plant)))
    if not (root / name).exists():
        make_task(root, name, files={"tests/expected.txt": "42\n", "tests/check.py": KEY_CHECK})
    env = TerminalEnv(root / name, bash_timeout=20)
    try:
        reward, info, _ = await play(env, row(env), plant)
        problem = info["episode_summary"]["verifier_problem"] or ""
        assert reward == 0.0 and "symlink into /tests, /logs or /proc" in problem, (info, info["verifier_output"])
        # a symlink inside the working directory, and the solution, are verified as before
        reward, info, _ = await play(env, row(env), SOLVE_SH + "mv answer.txt out.txt && ln -s out.txt answer.txt\n")
        assert reward == 1.0, info
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
async def test_a_symlink_in_a_directory_the_verifier_cannot_list_is_not_verified(root):
    """A verifier that is not root enters a directory with mode 311 but cannot list it: the guard cannot see
    the symlink inside, the tests can still open it by name."""
    toml = TASK_TOML.replace("[verifier]\n", '[verifier]\nuser = "nobody"\n')
    env = TerminalEnv(make_task(root, "hidden-dir", toml=toml, files={
        "tests/expected.txt": "42\n", "tests/check.py": KEY_CHECK.replace("/app/answer.txt", "/app/out/answer.txt")}))
    try:
        reward, info, _ = await play(env, row(env), "mkdir out && ln -s /tests/expected.txt out/answer.txt && chmod 311 out")
        problem = info["episode_summary"]["verifier_problem"] or ""
        assert reward == 0.0 and "can enter but not list" in problem, (info, info["verifier_output"])
        reward, info, _ = await play(env, row(env), SOLVE_SH + "mkdir out && mv answer.txt out/ && chmod 700 out\n")
        assert reward == 0.0 and "answer: PermissionError" in info["verifier_output"], info  # its own doing
        reward, info, _ = await play(env, row(env), SOLVE_SH + "mkdir out && mv answer.txt out/\n")
        assert reward == 1.0, info
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
@pytest.mark.parametrize("name, image_env, verifier_env, message", [
    ("verifier-path", "", 'PATH = "/app/bin:/usr/bin:/bin"', "PATH holds '/app/bin'"),
    ("empty-path-entry", "ENV PATH=/usr/local/bin:/usr/bin:/bin:", "", "PATH holds ''"),  # the current directory
    ("ld-library-path", "ENV LD_LIBRARY_PATH=/usr/local/lib:/app/lib", "", "LD_LIBRARY_PATH holds '/app/lib'"),
    ("bash-env", "", 'BASH_ENV = "/var/tmp/rc"', "BASH_ENV holds '/var/tmp/rc'"),
])
async def test_search_variables_through_what_the_agent_writes_are_refused(root, name, image_env, verifier_env,
                                                                          message):
    from forge_env.sandbox.docker import image_name
    toml = TASK_TOML.replace("[verifier]\n", f"[verifier]\nenv = {{ {verifier_env} }}\n") if verifier_env else TASK_TOML
    dockerfile = f"FROM {image_name()}\nWORKDIR /app\n{image_env}\n"
    env = TerminalEnv(make_task(root, name, toml=toml, dockerfile=dockerfile))
    try:
        with pytest.raises(TerminalTaskError, match=message.replace("(", r"\(")):
            await env.areset(options={"task": row(env)})
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
async def test_the_images_healthcheck_does_not_run_in_the_verifier(root):
    """A HEALTHCHECK of a script in the working directory ran, as root, beside the tests: the agent's script
    wrote reward.json (which wins over the tests' reward.txt)."""
    from forge_env.sandbox.docker import image_name
    dockerfile = (f"FROM {image_name()}\nWORKDIR /app\nCOPY data.txt /app/data.txt\nRUN echo true > /app/health.sh\n"
                  "HEALTHCHECK --interval=1s CMD sh /app/health.sh\n")
    test_sh = "#!/bin/bash\nsleep 4\necho 0 > /logs/verifier/reward.txt\n"
    env = TerminalEnv(make_task(root, "healthcheck", dockerfile=dockerfile, test_sh=test_sh), bash_timeout=20)
    try:
        reward, info, _ = await play(env, row(env), "echo 'mkdir -p /logs/verifier; echo {\\\"reward\\\": 1} > "
                                     "/logs/verifier/reward.json' > health.sh")
        assert reward == 0.0 and info["episode_summary"]["reward_source"] == "reward.txt", info
    finally:
        await env.aclose()


#: Files the agent can leave where a shell or Python might look for them at start-up, each writing the reward.
STARTUP = r"""
w='import os; os.makedirs("/logs/verifier", exist_ok=True); open("/logs/verifier/reward.json", "w").write("{\"reward\": 1}")'
for f in sitecustomize.py usercustomize.py; do echo "$w" > $f; done
echo "import os; $w" > zz.pth
s='echo "{\"reward\": 1}" > /logs/verifier/reward.json'
for f in .bashrc .profile .bash_profile .bash_login .bash_logout .env; do echo "$s" > $f; cp $f /var/tmp/$f; done
printf '#!/bin/sh\n%s\n' "$s" > python3; chmod 4755 python3; cp python3 bash; cp python3 env
mkfifo /var/tmp/fifo; echo planted
"""


@pytest.mark.docker
@requires_docker
async def test_startup_files_a_fifo_and_a_fork_bomb_do_not_reach_the_verifier(root):
    test_sh = ("#!/bin/bash\ncd /app\nbash -c true; sh -c true; bash -l -c true\n"
               "if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
    env = TerminalEnv(make_task(root, "startup", test_sh=test_sh), bash_timeout=20)
    try:
        bomb = "b() { b | b & }; (b) >/dev/null 2>&1 & sleep 2; echo bombed"
        reward, info, outputs = await play(env, row(env), STARTUP, bomb)
        assert "planted" in outputs[0] and reward == 0.0, (outputs, info)
        assert info["episode_summary"]["reward_source"] == "reward.txt" and "answer: None" in info["verifier_output"]
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
async def test_a_fifo_answer_times_the_verifier_out_as_a_0(root):
    toml = TASK_TOML.replace("[verifier]\ntimeout_sec = 60.0", "[verifier]\ntimeout_sec = 3.0")
    env = TerminalEnv(make_task(root, "fifo", toml=toml), bash_timeout=20)
    try:
        reward, info, _ = await play(env, row(env), "mkfifo answer.txt")
        assert reward == 0.0 and info["episode_summary"]["verifier_timed_out"] is True, info
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
async def test_the_agent_finds_no_tests_solution_or_task_files(root):
    env = TerminalEnv(make_task(root, "look", files={"tests/expected.txt": "42\n"}), bash_timeout=20)
    try:
        _, _, outputs = await play(env, row(env), "find / -xdev \\( -name 'check.py' -o -name 'expected.txt' -o "
                                   "-name 'solve.sh' -o -name 'test.sh' -o -name 'task.toml' -o -name 'instruction.md' "
                                   "-o -name 'forge-lockdown.py' \\) 2>/dev/null | grep -v '^/proc' ; echo end")
        assert outputs[0].strip() == "end", outputs
    finally:
        await env.aclose()


@pytest.mark.docker
@requires_docker
async def test_an_image_with_a_volume_is_refused(root):
    from forge_env.sandbox.docker import image_name
    # what the agent writes to a volume is never committed (nor measured, nor locked down: /data stays 777)
    dockerfile = f"FROM {image_name()}\nWORKDIR /app\nRUN mkdir /data && chmod 777 /data\nVOLUME /data\n"
    env = TerminalEnv(make_task(root, "volume", dockerfile=dockerfile))
    try:
        with pytest.raises(TerminalTaskError, match="declares VOLUME /data"):
            await env.areset(options={"task": row(env)})
    finally:
        await env.aclose()


#: Forks sleepers (in sessions of their own: they outlive the call) until the kernel refuses; prints how many.
HOG = """python3 -c "
import os
n = 0
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        os.execvp('sleep', ['sleep', '300'])
    n += 1
print(n)"
"""


@pytest.mark.docker
@requires_docker
async def test_an_agent_holding_every_process_does_not_starve_a_concurrent_episode(root):
    """Every agent container runs as the same uid: RLIMIT_NPROC counted them all together, so one agent's
    sleepers made the other episodes' bash calls fail (a correct episode scored 0, e.g. its GRPO group mates)."""
    task = make_task(root, "hog")
    options = {"max_processes": 40}
    hog, victim = TerminalEnv(task, sandbox_options=options), TerminalEnv(task, sandbox_options=options)
    try:
        await hog.areset(options={"task": row(hog)})
        observation, *_ = await hog.astep({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": HOG})}}]})
        assert int(observation[0]["content"].split()[0]) >= 30, observation  # bounded by its own container
        reward, info, outputs = await play(victim, row(victim), SOLVE_SH + "cat answer.txt\n")
        assert outputs[0].strip() == "42" and reward == 1.0, (outputs, info)
    finally:
        await hog.aclose()
        await victim.aclose()
