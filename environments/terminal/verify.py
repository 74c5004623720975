"""The verifier: the task's ``tests/test.sh`` in a fresh container from the agent's final file system.

Harbor's own runner verifies in the container the agent used, where the agent (root there) could have
written ``/logs/verifier/reward.txt`` already, put files where ``/tests`` will be copied, or left a process
that writes the reward (or edits the tests) while they run. Terminal-v0 closes those holes:

- the agent's container is committed to an image (paused: one instant of its file system) and removed with
  every process in it; the verifier's container starts from that image, so nothing the agent started is
  alive in it;
- ``/tests`` (a fresh copy of the task's ``tests/``) and ``/logs/verifier`` (an empty directory) are bind
  mounts of host directories made for this run, over paths the agent could not write anyway (the agent
  layer removed them, see ``images.py``); whatever the agent left there is hidden;
- the task image's ``HEALTHCHECK`` is off in the verifier's container (it runs beside the tests, as the
  container's user, a command that may well be a script of the working directory);
- the agent could never write the programs the verifier runs (``images.py``), and its own ``tmpfs``
  (``/tmp``, ``/dev/shm``) and home directory are not part of the committed image;
- before ``test.sh``, :data:`GUARD` refuses a symlink the agent left that leads into ``/tests``, ``/logs`` or
  ``/proc`` (the answer key at a path the tests read as the agent's answer);
- ``test.sh`` runs as PID 1 (``bash``), so code under test cannot kill the script before it writes its
  result; the reward files are read on the host after the container has stopped (no process of the
  verifier's container can write them afterwards), as regular files only (no symlinks), size-capped.

Reward (Harbor's contract): ``/logs/verifier/reward.json`` (an object of named numbers; ``"reward"`` or its
only entry is the reward) wins over ``reward.txt`` (one number). No reward file, an unreadable one, or a
verifier past ``[verifier].timeout_sec`` gives 0 and says why.

What it cannot prevent: code the agent wrote, run by the tests as the verifier's user, writing the reward
files itself (e.g. a ``reward.json`` beside a test script's ``reward.txt``). Tests that run the agent's code
should run it as an unprivileged user; see docs/ecosystem.md.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import tempfile
import time
from typing import Any

from environments.terminal.images import TEMP_DIRS, TaskImages
from environments.terminal.tasks import TerminalTask
from forge_env.core.verdict import Verdict
from forge_env.sandbox.base import SandboxUnavailableError
from forge_env.sandbox.docker_engine import docker_module, engine_errors, explain, remove_container

REWARD_FILE_CAP = 64 << 10
#: The exit status of GUARD when it refuses to run the tests.
GUARD_REFUSED = 97
#: Run by the verifier's container before ``test.sh`` (as its user, with the image's ``python3 -I``), then
#: exec'd into it (``test.sh`` stays PID 1). The agent wrote nothing but the working directory and the
#: sticky temporary directories; a symlink there that leads into ``/tests`` or ``/logs`` (which exist only
#: now) or through ``/proc`` (``/dev/fd/3``: whatever the reading process has open) would show the answer
#: key, or take the tests' writes, at a path the tests read as the agent's. Such a link, or a directory the
#: verifier can enter but not list (it could hide one), refuses the verification. argv: the directories to
#: search, "--", the command to exec.
GUARD = r'''
import os, sys
sep = sys.argv.index("--")
roots, command = sys.argv[1:sep], sys.argv[sep + 1:]
HIDDEN = ("/tests", "/logs", "/proc")

def under(path):
    return any(path == h or path.startswith(h + "/") for h in HIDDEN)

def leads_into_hidden(link):
    """Whether resolving ``link`` (absolute) visits a hidden path, following every symlink on the way."""
    done, parts, hops = "/", [p for p in link.split("/") if p], 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        path = os.path.join(done, part)
        if under(path):
            return True
        if os.path.islink(path):
            hops += 1
            if hops > 64:
                return True
            target = os.readlink(path)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                done = "/"
            continue
        done = path
    return under(done)

found = []
def unlistable(error):
    if os.access(error.filename, os.X_OK):
        found.append(error.filename + " (a directory the verifier can enter but not list)")

for root in sorted({os.path.realpath(r) for r in roots}):  # the image's own links (/var/lock -> /run/lock)
    if not os.path.isdir(root):
        continue
    for top, dirs, files in os.walk(root, onerror=unlistable):
        for name in dirs + files:
            path = os.path.join(top, name)
            if os.path.islink(path) and leads_into_hidden(path):
                found.append(path + " -> " + os.readlink(path))
        if len(found) > 20:
            break
if found:
    sys.stderr.write("forge-env guard: not verified: the agent left a symlink into /tests, /logs or /proc, or a "
                     "hidden directory: " + "; ".join(found[:5]) + "\n")
    sys.exit(__REFUSED__)
os.execv(command[0], command)
'''.replace("__REFUSED__", str(GUARD_REFUSED))
OUTPUT_CAP = 8000
#: Capabilities the verifier keeps (root's usual file powers and switching users; nothing else).
VERIFIER_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]


def verifier_verdict(reward: float = 0.0, *, rewards: dict[str, float] | None = None, source: str | None = None,
                     problem: str | None = None, exit_code: int | None = None, timed_out: bool = False,
                     seconds: float = 0.0, output_tail: str = "") -> Verdict:
    """What verification found, as a :class:`~forge_env.core.verdict.Verdict`: the reward, the metrics
    (``resolved``, ``verifier_timed_out``, ``reward_file_missing``, ``reward_<name>`` for the other
    named rewards), the record for the episode's summary (``reward_source``, ``verifier_problem``, ...) and the
    verifier's output (``info["verifier_output"]``). ``problem``: why the reward is 0 without a reward file's say;
    ``source``: ``"reward.json"`` / ``"reward.txt"``."""
    rewards = dict(rewards or {})
    named = {f"reward_{k}": v for k, v in rewards.items() if k != "reward"}
    metrics = {"resolved": float(reward >= 1.0), "verifier_timed_out": float(timed_out),
               "reward_file_missing": float(source is None), **named}
    summary = {"reward": reward, "rewards": rewards, "reward_source": source, "verifier_problem": problem,
               "verifier_exit_code": exit_code, "verifier_timed_out": timed_out}
    return Verdict(reward=reward, metrics=metrics, passed=reward >= 1.0, status="timeout" if timed_out else "",
                   detail=problem or "", seconds=seconds, summary=summary, info={"verifier_output": output_tail})


def _read_capped(path: str) -> bytes | None:
    """A regular file's bytes (None when absent); ValueError for a symlink, special file or one too big."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{os.path.basename(path)} cannot be opened as a regular file ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{os.path.basename(path)} is not a regular file")
        if info.st_size > REWARD_FILE_CAP:
            raise ValueError(f"{os.path.basename(path)} is larger than {REWARD_FILE_CAP} bytes")
        return os.read(fd, REWARD_FILE_CAP + 1)
    finally:
        os.close(fd)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} is not a finite number: {value!r}")
    return float(value)


def read_rewards(directory: str) -> tuple[dict[str, float], str]:
    """(named rewards, the file they came from) from a verifier's log directory; ValueError when neither
    reward file is there or the one that counts is malformed (reward.json wins over reward.txt)."""
    data = _read_capped(os.path.join(directory, "reward.json"))
    if data is not None:
        try:
            parsed = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"reward.json is not JSON ({exc})") from None
        if not isinstance(parsed, dict) or not parsed:
            raise ValueError(f"reward.json must be a non-empty object of named numbers, got {parsed!r:.200}")
        return {str(k): _number(v, f"reward.json's {k!r}") for k, v in parsed.items()}, "reward.json"
    data = _read_capped(os.path.join(directory, "reward.txt"))
    if data is None:
        raise ValueError("the verifier wrote no reward file (/logs/verifier/reward.txt or reward.json)")
    try:
        return {"reward": _number(float(data.decode().strip()), "reward.txt")}, "reward.txt"
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"reward.txt is not one number: {data[:100]!r}") from None


def main_reward(rewards: dict[str, float]) -> float:
    """The episode's reward from named rewards: ``"reward"``, else the only one; ValueError otherwise."""
    if "reward" in rewards:
        return rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.values()))
    raise ValueError(f"reward.json names several rewards {sorted(rewards)} and none is 'reward'")


def _read_timeout(exc: BaseException) -> bool:
    """Whether a transport error is the read timeout of a wait (the engine answered nothing in time)."""
    import requests
    import urllib3

    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, requests.exceptions.ReadTimeout | urllib3.exceptions.ReadTimeoutError):
            return True
        if isinstance(item, BaseException):
            stack.extend([*item.args, item.__cause__, item.__context__])
    return False


def check_local_engine() -> None:
    """SandboxUnavailableError unless the Docker engine is on this machine (the verifier's ``/tests`` and
    ``/logs/verifier`` are host directories)."""
    if not os.environ.get("DOCKER_HOST", "unix://").startswith("unix://"):
        raise SandboxUnavailableError(f"Terminal-v0's verifier needs a Docker engine on this machine (its /tests and "
                                      f"/logs/verifier are host directories); DOCKER_HOST is {os.environ['DOCKER_HOST']}")


def probe_engine(client: Any, image: str, *, timeout: float = 120.0) -> str | None:
    """Run a harmless container (``/bin/sh -c 'exit 0'``) from ``image`` (the task's, not the agent's commit) the way
    the verifier runs: None when it exits 0, else why not. Tells a verifier that fails for the machine from
    one that fails for what the agent left (``forge_env.workspace.retry_machine_failure``). Blocking."""
    container = None
    try:
        container = client.containers.create(image, command=["/bin/sh", "-c", "exit 0"], entrypoint=[],
                                              network_mode="none", cap_drop=["ALL"], healthcheck={"test": ["NONE"]},
                                              labels={"forge_env.terminal": "probe"}, stdin_open=False, tty=False)
        container.start()
        code = int(container.wait(timeout=timeout)["StatusCode"])
        return None if code == 0 else f"a container that does nothing exited with {code}"
    except Exception as exc:  # noqa: BLE001 - whatever the engine raised, it failed a harmless container
        return f"the Docker engine could not run a container that does nothing: {explain(exc)}"
    finally:
        if container is not None:
            remove_container(client, container.id)


def verify(client: Any, task: TerminalTask, images: TaskImages, state_image: str, *,
           timeout: float | None = None, memory_mb: int = 2048, max_processes: int = 512) -> Verdict:
    """Run the task's tests on ``state_image`` (the agent's committed file system); see the module docstring.
    Blocking (call it in a thread). SandboxUnavailableError when the engine fails."""
    docker = docker_module()
    import requests  # the docker SDK's transport: its read timeout is the verifier's deadline
    import urllib3

    check_local_engine()
    started = time.monotonic()
    seconds = float(timeout or task.verifier_timeout_s)
    scratch = tempfile.mkdtemp(prefix="forge-terminal-verify-")
    container = None
    try:
        tests = os.path.join(scratch, "tests")
        logs = os.path.join(scratch, "logs")
        shutil.copytree(task.tests_dir, tests, symlinks=False)
        os.makedirs(logs)
        os.chmod(scratch, 0o700)  # the verifier's root could leave a setuid file in logs/: no host user reaches it
        if task.verifier_user not in ("root", "0"):
            os.chmod(logs, 0o777)  # the verifier's own user writes it (no agent process is alive to)
            for top, dirs, files in os.walk(tests):
                for name in dirs + files:
                    os.chmod(os.path.join(top, name), 0o755)
        # Exactly the task image's environment and [verifier].env (``env -i``: the committed image's config
        # also holds the agent container's variables), then bash as PID 1 (env execs it).
        environment = images.env | {"HOME": "/root" if task.verifier_user in ("root", "0") else "/tmp"}
        environment |= task.verifier_env
        command = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in environment.items()), "/bin/bash",
                   "/tests/test.sh"]
        roots = [images.workdir, *(d for d in TEMP_DIRS if d not in ("/tmp", "/dev/shm"))]
        command = ["/usr/bin/env", "-i", f"PATH={images.env['PATH']}", "python3", "-I", "-c", GUARD, *roots, "--",
                   *command]
        try:
            container = client.containers.create(
                state_image, command=command, entrypoint=[], user=task.verifier_user,
                working_dir=images.workdir, network_mode="none",
                volumes={tests: {"bind": "/tests", "mode": "rw"}, logs: {"bind": "/logs/verifier", "mode": "rw"}},
                cap_drop=["ALL"], cap_add=VERIFIER_CAPS, security_opt=["no-new-privileges"],
                healthcheck={"test": ["NONE"]},  # the image's HEALTHCHECK would run (as root) what the agent wrote
                mem_limit=f"{memory_mb}m", pids_limit=max_processes, labels={"forge_env.terminal": "verifier"},
                log_config=docker.types.LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
                stdin_open=False, tty=False)
            container.start()
        except engine_errors() as exc:
            raise SandboxUnavailableError(f"{task.name}: the Docker engine could not start the verifier: "
                                          f"{explain(exc)}") from None
        timed_out, exit_code = False, None
        try:
            exit_code = int(container.wait(timeout=seconds)["StatusCode"])
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as exc:
            if not _read_timeout(exc):
                raise SandboxUnavailableError(f"{task.name}: the Docker engine failed while the verifier ran: "
                                              f"{explain(exc)}") from None
            timed_out = True  # past the verifier's time
            try:
                container.kill()
                container.wait(timeout=60)
            except engine_errors():
                pass
        except engine_errors() as exc:
            raise SandboxUnavailableError(f"{task.name}: the Docker engine failed while the verifier ran: "
                                          f"{explain(exc)}") from None
        try:
            output = container.logs(stdout=True, stderr=True, tail=200).decode("utf-8", "replace")[-OUTPUT_CAP:]
        except engine_errors():
            output = ""
        reward, rewards, source, problem = 0.0, {}, None, None
        guard = [line for line in output.splitlines() if line.startswith("forge-env guard: ")]
        if timed_out:
            problem = f"the verifier ran past its {seconds:g} s and was killed"
        elif exit_code == GUARD_REFUSED and guard:
            problem = guard[0].removeprefix("forge-env guard: ")
        else:
            try:
                rewards, source = read_rewards(logs)
                reward = main_reward(rewards)
            except ValueError as exc:
                problem = str(exc)
        return verifier_verdict(reward, rewards=rewards, source=source, problem=problem, exit_code=exit_code,
                                timed_out=timed_out, seconds=time.monotonic() - started, output_tail=output)
    finally:
        if container is not None:
            remove_container(client, container.id)
        shutil.rmtree(scratch, ignore_errors=True)
