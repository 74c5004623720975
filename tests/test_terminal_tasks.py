"""Terminal-v0's Harbor task loader and reward files, without Docker: a directory of task dirs or one task dir
loads; a malformed task.toml (or a task Terminal-v0 cannot run as Harbor would) is a clear error at load;
reward.json wins over reward.txt and bad reward files are refused."""

from __future__ import annotations

import json
import os

import pytest

from environments.terminal import TerminalEnv, TerminalTaskError, load_task, load_tasks, read_rewards
from environments.terminal.verify import main_reward
from tests.terminal_support import TASK_TOML, make_task


def test_one_task_dir_or_a_directory_of_them(tmp_path):
    first = make_task(tmp_path, "alpha")
    make_task(tmp_path, "beta", toml="[task]\nname = \"org/beta\"\n" + TASK_TOML)
    (tmp_path / "not-a-task").mkdir()
    assert [t.name for t in load_tasks(tmp_path)] == ["alpha", "org/beta"]
    [task] = load_tasks(first)
    assert task.name == "alpha" and task.agent_timeout_s == 300.0 and task.verifier_timeout_s == 60.0
    assert task.memory_mb == 1024 and task.verifier_user == "root" and task.metadata["category"] == "testing"
    assert task.solution is not None and "answer.txt" in task.solution
    assert "/app/data.txt" in task.instruction
    env = TerminalEnv(tmp_path)
    assert [r["task_id"] for r in env.tasks] == ["alpha", "org/beta"]


def test_defaults_when_task_toml_is_minimal(tmp_path):
    task = load_task(make_task(tmp_path, "bare", toml=""))
    assert task.agent_timeout_s == 600.0 and task.verifier_timeout_s == 600.0 and task.docker_image is None


@pytest.mark.parametrize("toml, message", [
    ("[verifier\ntimeout_sec = 1", "not valid TOML"),
    ("[verifier]\ntimeout_sec = \"soon\"", "timeout_sec must be a positive number"),
    ("[agent]\ntimeout_sec = -5", "timeout_sec must be a positive number"),
    ("[agent]\ntimeout_sec = true", "timeout_sec must be a positive number"),
    ("verifier = 3", "[verifier] must be a table"),
    ("[verifier]\nenv = { KEY = 1 }", "env must be a table of strings"),
    ("[environment]\nworkdir = \"app\"", "workdir must be an absolute path"),
    ("[environment]\nmemory_mb = \"2G\"", "memory_mb must be a positive int"),
    ("[environment]\nstorage_mb = 0", "storage_mb must be a positive int"),
    ("[environment]\ngpus = 1", "need GPUs"),
    ("[environment]\nos = \"windows\"", "linux only"),
    ("[verifier]\nenvironment_mode = \"separate\"", "separate verifier environment"),
    ("[[steps]]\nname = \"one\"", "multi-step"),
    ("[environment]\ndocker_image = \"\"", "docker_image must be a non-empty string"),
])
def test_malformed_task_toml_is_a_clear_error_at_load(tmp_path, toml, message):
    task = make_task(tmp_path, "broken", toml=toml)
    with pytest.raises(TerminalTaskError, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
        TerminalEnv(tmp_path)
    assert str(task / "task.toml") in str(caught.value)


def test_missing_pieces_are_clear_errors(tmp_path):
    task = make_task(tmp_path, "t")
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(TerminalTaskError, match="needs tests/test.sh"):
        load_tasks(task)
    (task / "tests" / "test.sh").write_text("exit 0\n")
    (task / "environment" / "Dockerfile").unlink()
    with pytest.raises(TerminalTaskError, match="environment/Dockerfile or \\[environment\\].docker_image"):
        load_tasks(task)
    (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(TerminalTaskError, match="docker-compose"):
        load_tasks(task)
    with pytest.raises(TerminalTaskError, match="holds no Harbor task"):
        load_tasks(tmp_path / "t" / "tests")
    with pytest.raises(TerminalTaskError, match="no such directory"):
        load_tasks(tmp_path / "nowhere")
    # without tasks: the bundled example task (issue 47: gymnasium.make works for every registered id)
    assert list(TerminalEnv().terminal_tasks) == ["fix-csv-total"]


def test_duplicate_names_are_refused(tmp_path):
    make_task(tmp_path / "a", "t")
    make_task(tmp_path / "b", "t")
    with pytest.raises(TerminalTaskError, match="two tasks are named 't'"):
        load_tasks([tmp_path / "a", tmp_path / "b"])


def test_unhonoured_settings_are_noted(tmp_path):
    task = load_task(make_task(tmp_path, "t", toml="[agent]\nuser = \"root\"\n[environment]\nallow_internet = true\n"))
    assert any("allow_internet" in n for n in task.notes) and any("[agent].user" in n for n in task.notes)


def test_reward_files(tmp_path):
    logs = str(tmp_path)
    with pytest.raises(ValueError, match="no reward file"):
        read_rewards(logs)
    (tmp_path / "reward.txt").write_text(" 1\n")
    assert read_rewards(logs) == ({"reward": 1.0}, "reward.txt")
    (tmp_path / "reward.json").write_text(json.dumps({"reward": 0.25, "speed": 1}))
    assert read_rewards(logs) == ({"reward": 0.25, "speed": 1.0}, "reward.json")  # JSON wins
    assert main_reward({"only": 0.5}) == 0.5
    with pytest.raises(ValueError, match="none is 'reward'"):
        main_reward({"a": 1.0, "b": 0.0})
    for bad, message in [("[1]", "non-empty object"), ("{}", "non-empty object"), ('{"reward": "1"}', "not a finite"),
                         ('{"reward": true}', "not a finite"), ("{", "not JSON"), ('{"reward": NaN}', "not a finite")]:
        (tmp_path / "reward.json").write_text(bad)
        with pytest.raises(ValueError, match=message):
            read_rewards(logs)
    (tmp_path / "reward.json").unlink()
    (tmp_path / "reward.txt").write_text("yes")
    with pytest.raises(ValueError, match="not one number"):
        read_rewards(logs)
    (tmp_path / "reward.txt").unlink()
    os.symlink("/etc/hostname", tmp_path / "reward.txt")  # a verifier-side symlink out of the log directory
    with pytest.raises(ValueError, match="regular file"):
        read_rewards(logs)
    (tmp_path / "reward.txt").unlink()
    (tmp_path / "reward.txt").write_text("1" * (65 << 10))
    with pytest.raises(ValueError, match="larger than"):
        read_rewards(logs)


def test_only_a_read_timeout_of_the_wait_counts_as_the_verifier_timing_out():
    import requests
    import urllib3

    from environments.terminal.verify import _read_timeout
    wrapped = requests.exceptions.ConnectionError(urllib3.exceptions.ReadTimeoutError(None, "/wait", "Read timed out."))
    assert _read_timeout(wrapped) and _read_timeout(requests.exceptions.ReadTimeout("slow"))
    assert not _read_timeout(requests.exceptions.ConnectionError("connection refused"))  # the engine is gone: infra


@pytest.mark.parametrize("failures, probe, expected", [
    (1, None, (1.0, 1, False)),  # the machine's once: run again in a fresh container, the retry counts
    (2, None, (0.0, 1, True)),  # twice on the same state while the engine runs a harmless container: graded 0
    (2, "the engine is down", "InfraError"),  # the harmless container fails too: the machine's, dropped
])
def test_a_verifier_that_fails_for_the_machine_is_retried_once_and_a_repeat_grades_as_failed(
        tmp_path, monkeypatch, failures, probe, expected):
    """Issue 47 item 1: the retry-once rule of Coding-v0 and SWE-v0 (forge_env.workspace.retry_machine_failure);
    before it, one verifier failure was an InfraError at once, and an agent could cancel its own grade."""
    import asyncio
    from types import SimpleNamespace

    from environments.terminal import env as terminal_env
    from environments.terminal.verify import verifier_verdict
    from forge_env import EpisodeState, InfraError
    from forge_env.sandbox.base import SandboxUnavailableError

    env = TerminalEnv(make_task(tmp_path, "t"))
    verified, probed = [], []

    def fake_verify(client, task, images, image, **kw):
        verified.append(image)
        if len(verified) <= failures:
            raise SandboxUnavailableError("t: the Docker engine could not start the verifier: boom")
        return verifier_verdict(1.0, rewards={"reward": 1.0}, source="reward.txt")

    class Workspace:
        sandbox = SimpleNamespace(client=object())

        async def commit(self, *args, **kwargs):
            return "state-image"

    monkeypatch.setattr(terminal_env, "verify", fake_verify)
    monkeypatch.setattr(terminal_env, "probe_engine", lambda client, image: probed.append(image) or probe, raising=False)
    monkeypatch.setattr(terminal_env, "_remove_image", lambda client, image: None)
    task = env.terminal_tasks["t"]
    state = EpisodeState(task=task.to_row(), data={"terminal_task": task, "workspace": Workspace(),
                                                   "images": SimpleNamespace(agent_image="task-image")})
    if expected == "InfraError":
        with pytest.raises(InfraError, match="the engine is down"):
            asyncio.run(env.verify_episode(state))
    else:
        verdict = asyncio.run(env.verify_episode(state))
        reward, retries, lost = expected
        assert (verdict.reward, verdict.metrics["verifier_retries"], bool(verdict.metrics["verifier_lost"])) == (
            reward, retries, lost)
        assert verdict.summary["verifier_lost"] is lost
        if lost:
            assert "failed twice" in verdict.summary["verifier_problem"]
    assert verified == ["state-image"] * min(failures + 1, 2)  # the same committed state, at most twice
    assert probed == (["task-image"] if failures == 2 else [])  # the task's image, never the agent's commit
