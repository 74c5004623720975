"""Terminal-v0: Harbor tasks (Terminal-Bench 2.0's format) with a ``bash`` tool in the task's container.

An episode is one Harbor task directory (``environments.terminal.tasks``). The model gets the task's
``instruction.md`` and one tool, ``bash``, which runs a command in the task's container as an unprivileged
user (:data:`~environments.terminal.images.AGENT_UID`), in the task's working directory, with no network;
each call is bounded in time (``bash_timeout``; a timeout is an observation, the container survives),
output and processes. The container is a docker-backend sandbox session (a ``forge_env.workspace.Workspace``
runs the commands) started from the task's image with the agent layer on top (``images.py``).

A turn without tool calls ends the agent's part, as does running out of the task's ``[agent].timeout_sec``
(the ``time_up`` stop condition).
The container's file system is then committed, the container removed with every process in it, and the
task's ``tests/test.sh`` run in a fresh container from the commit (``verify.py``, which says what the agent
cannot do to its reward). The reward is what
the verifier wrote (``reward.json`` over ``reward.txt``); ``info["episode_summary"]`` carries the named
rewards, where the reward came from, and any problem (no reward file, a verifier timeout). An episode cut
short by ``max_turns`` is not verified (reward 0). A verification that fails for the machine (the engine
could not start or wait for the verifier's container) is run again, once, in a fresh container from the same
commit; when it fails again, a harmless container from the task's image decides whose failure it is
(``forge_env.workspace.retry_machine_failure``, the rule of Coding-v0 and SWE-v0): the engine failing that too is
an ``InfraError`` (the episode is dropped), else the agent's final state is graded as failed (reward 0,
``verifier_lost``), so an agent cannot cancel its own grade by breaking its verifier.

Needs a local Docker engine (the verifier's ``/tests`` and ``/logs/verifier`` are host directories) and
task images with ``/bin/sh`` and ``python3``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from environments.terminal.images import AGENT_UID, TaskImages, prepare
from environments.terminal.tasks import TerminalTask, TerminalTaskError, load_task, load_tasks
from environments.terminal.verify import check_local_engine, probe_engine, verifier_verdict, verify
from forge_env import EpisodeEnd, EpisodeState, InfraError, TaskError, TextEnv, Tool, ToolError, Verdict
from forge_env.sandbox import make_sandbox
from forge_env.sandbox.base import SandboxError
from forge_env.sandbox.docker import SessionTooLargeError
from forge_env.types import Message, assistant_message, make_tool_call
from forge_env.workspace import CELL, GRACE_S, Workspace, WorkspaceError, parse_reply, retry_machine_failure

#: The agent container's limits (per ``bash`` call; the session's tmpfs is its /tmp and home). Every agent
#: container runs as the same uid, so ``max_processes`` bounds each container's processes through its pids
#: cgroup, not RLIMIT_NPROC (which would count all concurrent episodes' agents together: one agent holding
#: them all would fail the others' calls); see DockerSandbox's ``uid``.
SANDBOX_DEFAULTS: dict[str, Any] = {"cpu_seconds": 600, "wall_timeout_s": 600, "memory_mb": 2048,
                                    "workdir_size_mb": 256, "max_output_bytes": 16 << 20, "max_processes": 512,
                                    "open_files": 256, "file_size_mb": 256, "max_files": 65536}
STATE_REPO = "forge-env/terminal-state"
#: The task set Terminal-v0 runs without ``tasks``: the bundled example task (a directory of task directories),
#: so that ``gymnasium.make("forge_env/Terminal-v0")`` works as it does for every registered id.
BUNDLED_TASKS = Path(__file__).parent / "bundled"
LOST_NOTE = ("[the sandbox lost the task's container (its processes were killed); a fresh one was started from the "
             "task's image: earlier changes are gone]")

SYSTEM_PROMPT = ("You are working in a Linux container through a bash tool (no network). Do what the task asks; "
                 "when it is done, reply without calling a tool. Your work is then checked by hidden tests.")

#: Appended to the workspace cell (``forge_env.workspace.CELL``): bash runs in the task's working directory with the image's
#: environment; the session's own scratch directory is the agent's home.
TERMINAL_CELL = CELL + r'''
_ROOT = __WORKDIR__
_HOME = os.path.join(os.getcwd(), "home")
_ENV = {"LANG": "C.UTF-8", "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", **__ENV__, "HOME": _HOME,
        "USER": "agent", "TMPDIR": "/tmp"}

def _start():
    os.umask(0o022)  # files the agent makes are readable by a verifier that is not root (as in Harbor)
    os.makedirs(_HOME, exist_ok=True)
    _reply({"ok": _ROOT})
'''


class TerminalWorkspace(Workspace):
    """A workspace with the task's container in place of a checkout: ``bash`` only, and a commit."""

    def __init__(self, sandbox: Any, images: TaskImages, *, output_cap: int = 8000) -> None:
        super().__init__(sandbox, None, output_cap=output_cap, reset_note=LOST_NOTE)
        env = {k: v for k, v in images.env.items() if k not in ("HOME", "USER")}
        self.cell = (TERMINAL_CELL.replace("__WORKDIR__", json.dumps(images.workdir))
                     .replace("__ENV__", json.dumps(env)))

    async def start(self) -> str:
        try:
            self.session = self.sandbox.session()
            result = await self.session.run(self.cell + "\n_start()\n", timeout=120)
        except (SandboxError, OSError) as exc:
            raise InfraError(f"Terminal-v0: the sandbox could not start the task's container ({exc})") from exc
        reply = parse_reply(result)
        if reply is None or "ok" not in reply:
            raise InfraError(f"Terminal-v0: the task's container did not start ({result.summary(600)})")
        self.root = reply["ok"]
        return self.root

    async def commit(self, repository: str, tag: str, *, max_mb: float, max_paths: int) -> str:
        """Commit the container's file system, then close the workspace (its container and processes go).
        A container the agent lost (a call cut short by the turn's tool time, its shell killed) is replaced
        first, as the next ``bash`` call would replace it: the fresh one is what gets verified. Past the
        storage limits nothing is committed (SessionTooLargeError)."""
        if self.session is None:
            raise InfraError("Terminal-v0: the workspace was closed before it could be committed")
        try:
            await self.call("bash", 30, command=":", timeout=30, cap=100)
        except WorkspaceError:
            pass  # lost and started again (or the probe itself failed): what is there now is verified
        try:
            return await self.sandbox.commit_session(self.session, repository, tag, max_mb=max_mb,
                                                     max_paths=max_paths)
        except SandboxError as exc:
            raise InfraError(f"Terminal-v0: {exc}") from exc
        finally:
            await self.close()


class TerminalEnv(TextEnv):
    """Harbor tasks in a container (see the module docstring).

    Args:
        tasks: a Harbor task directory, a directory of them, or a list of either (or of TerminalTasks); default:
            :data:`BUNDLED_TASKS` (the bundled example task, ``fix-csv-total``).
        dataset: alias of ``tasks`` for configs.
        bash_timeout: seconds per ``bash`` call (capped by what is left of the task's agent time).
        sandbox_options: the agent containers' limits and docker-backend options (see SANDBOX_DEFAULTS).
        verifier_memory_mb: the verifier container's memory.
        storage_mb: the most the agent's changes to the file system may take, sparse files at their full
            size (a task's ``[environment].storage_mb`` lowers it); past it the work is not verified (reward 0)
            and nothing is committed.
        storage_paths: the most paths the agent may add, change or delete (each costs the commit a tar
            header); past it, likewise not verified.
        prebuild: build every task's images now (a task whose image cannot be built fails here, not at its
            first reset); default: on each task's first episode.
    """

    def __init__(self, tasks: Any = None, *, dataset: Any = None, bash_timeout: float = 60.0,
                 sandbox_options: dict[str, Any] | None = None, verifier_memory_mb: int = 2048,
                 storage_mb: int = 2048, storage_paths: int = 200_000, prebuild: bool = False, max_turns: int = 50,
                 **kwargs: Any) -> None:
        source = tasks if tasks is not None else dataset
        if source is None:
            source = BUNDLED_TASKS
        parsed = load_tasks(source)
        self.terminal_tasks = {t.name: t for t in parsed}
        self.bash_timeout = float(bash_timeout)
        self.sandbox_options = SANDBOX_DEFAULTS | (sandbox_options or {})
        self.verifier_memory_mb = int(verifier_memory_mb)
        self.storage_mb = int(storage_mb)
        self.storage_paths = int(storage_paths)
        self._sandboxes: dict[tuple[str, int], Any] = {}
        self._images: dict[str, TaskImages] = {}
        # One shell per episode: a turn's calls run one after another (run at once, each would wait for the
        # others inside its own deadline, and outliving it reads as the machine's fault), and no per-turn
        # budget cuts a call short (a cut call loses the container; the agent's time bounds the turn anyway).
        if kwargs.setdefault("parallel_tool_calls", False):
            raise ValueError("Terminal-v0 runs a turn's bash calls one at a time (one shell per episode): "
                             "parallel_tool_calls must be False")
        kwargs.setdefault("turn_tool_time_s", None)
        super().__init__(tasks=[t.to_row() for t in parsed], system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
                         max_turns=max_turns, **kwargs)
        if prebuild:
            for task in parsed:
                self._images[str(task.path)] = prepare(task)

    # ------------------------------------------------------------------ tasks
    def task_of(self, task: dict[str, Any]) -> TerminalTask:
        known = self.terminal_tasks.get(task.get("task_id", ""))
        if known is not None and str(known.path) == task.get("task_dir", str(known.path)):
            return known
        if "task_dir" in task:
            return load_task(task["task_dir"])
        raise TaskError(f"unknown Terminal-v0 task {task.get('task_id')!r}; give 'task_dir' (a Harbor task directory)")

    def validate_task(self, task: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(task, dict):
            raise TaskError(f"a task must be a dict, got {type(task).__name__}")
        try:
            found = self.task_of(task)
        except TerminalTaskError as exc:
            raise TaskError(str(exc)) from None
        return found.to_row()

    def initial_messages(self, task: dict[str, Any]) -> list[Message]:
        text = self.task_of(task).instruction.strip()
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}]

    # ------------------------------------------------------------------ episode
    def _sandbox(self, images: TaskImages, task: TerminalTask) -> Any:
        memory = int(task.memory_mb or self.sandbox_options["memory_mb"])
        key = (images.agent_image, memory)
        found = self._sandboxes.get(key)
        if found is None or getattr(found, "_closed", False):
            found = self._sandboxes[key] = make_sandbox(
                "docker", **(self.sandbox_options | {"memory_mb": memory}), image=images.agent_image,
                uid=AGENT_UID, read_only=False)
        return found

    async def _images_of(self, task: TerminalTask) -> TaskImages:
        images = self._images.get(str(task.path))
        if images is None:
            images = self._images[str(task.path)] = await asyncio.to_thread(prepare, task)
        return images

    async def setup_episode(self, state: EpisodeState) -> None:
        task = self.task_of(state.task)
        try:
            images = await self._images_of(task)
            sandbox = self._sandbox(images, task)
        except SandboxError as exc:
            raise InfraError(f"Terminal-v0: {exc}") from exc
        workspace = TerminalWorkspace(sandbox, images)
        state.data.update(terminal_task=task, images=images, workspace=workspace,
                          deadline=time.monotonic() + task.agent_timeout_s)
        await workspace.start()

    async def teardown_episode(self, state: EpisodeState) -> None:
        workspace = state.data.pop("workspace", None)
        if workspace is not None:
            await workspace.close()

    def episode_tools(self, state: EpisodeState) -> list[Tool]:
        async def bash(command: str) -> str:
            left = state.data["deadline"] - time.monotonic()
            if left <= 0:
                state.data["time_up"] = True
                return "[the task's time for the agent is up; the work is checked as it is now]"
            try:
                return await state.data["workspace"].bash(command, min(self.bash_timeout, left))
            except WorkspaceError as exc:
                raise ToolError(str(exc)) from None

        spec = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
        return [Tool("bash", f"Run a bash command in the task's container (no network; {self.bash_timeout:g}s "
                     "limit per call). Returns its output and exit code.", spec, bash,
                     self.bash_timeout + GRACE_S + 60, True)]

    def expert_action(self, observation: list[Message] | EpisodeState | None = None) -> Message:
        """Harbor's oracle as turns: ``solution/solve.sh`` as one ``bash`` call, then a final answer. (The script
        runs as the agent, as its text: files beside it in ``solution/`` are not copied in.)"""
        state = observation if isinstance(observation, EpisodeState) else self.state
        if state is None:
            raise ValueError("expert_action needs a running episode (call reset) or an EpisodeState")
        if any(m.get("role") == "tool" for m in state.messages):
            return assistant_message("Done.")
        solution = self.task_of(state.task).solution
        if solution is None:
            raise ValueError(f"task {state.task.get('task_id', '?')} has no solution/solve.sh")
        return assistant_message("", [make_tool_call("bash", {"command": solution})])

    async def verify_episode(self, state: EpisodeState) -> Verdict:
        """Commit the agent's container (then removed with its processes), verify the commit in a fresh one."""
        task: TerminalTask = state.data["terminal_task"]
        images: TaskImages = state.data["images"]
        workspace: TerminalWorkspace = state.data["workspace"]
        cap = min(self.storage_mb, task.storage_mb or self.storage_mb)
        try:
            image = await workspace.commit(STATE_REPO, uuid.uuid4().hex[:16], max_mb=cap, max_paths=self.storage_paths)
        except SessionTooLargeError as exc:
            state.data["verdict"] = verdict = verifier_verdict(problem=f"the agent's changes are not verified: {exc}")
            return verdict
        client = workspace.sandbox.client

        async def attempt() -> Verdict | SandboxError:
            try:
                return await asyncio.to_thread(verify, client, task, images, image, memory_mb=self.verifier_memory_mb)
            except SandboxError as exc:
                return exc

        async def probe() -> str | None:
            return await asyncio.to_thread(probe_engine, client, images.agent_image)

        try:
            check_local_engine()
            found = await retry_machine_failure(attempt, lambda r: str(r) if isinstance(r, SandboxError) else None,
                                                probe, what=f"Terminal-v0's verifier of {task.name}")
        except SandboxError as exc:
            raise InfraError(f"Terminal-v0: {exc}") from exc
        finally:
            await asyncio.to_thread(_remove_image, client, image)
        if found.lost:  # twice on the agent's final state, while the engine runs a harmless container
            verdict = verifier_verdict(problem=f"the verifier failed twice on the agent's final state ({found.result}); "
                                       "graded as failed")
        else:
            verdict = found.result
        verdict.metrics |= {"verifier_retries": float(found.retries), "verifier_lost": float(found.lost)}
        verdict.summary |= {"verifier_retries": found.retries, "verifier_lost": found.lost}
        state.data["verdict"] = verdict
        return verdict

    async def stop_condition(self, state: EpisodeState) -> str | None:
        """``"time_up"`` once a ``bash`` call found the task's agent time spent (a limit reached on the same turn
        wins: that episode is not verified)."""
        return "time_up" if state.data.get("time_up") else None

    async def grade_episode(self, state: EpisodeState, end: EpisodeEnd) -> Verdict | None:
        """Verify the agent's work on a final answer or when its time is up; an episode a limit cut short
        (``max_turns``) is not verified (reward 0)."""
        if end.truncated:
            return None
        verdict = await self.verify_episode(state)
        verdict.summary["time_up"] = bool(state.data.get("time_up"))
        return verdict

    async def aclose(self) -> None:
        await super().aclose()
        sandboxes, self._sandboxes = dict(self._sandboxes), {}
        for sandbox in sandboxes.values():
            await sandbox.close()


def _remove_image(client: Any, image: str) -> None:
    try:
        client.images.remove(image, force=True)
    except Exception:  # noqa: BLE001 - a leftover image costs disk, never correctness
        pass


def task_path(path: str | Path) -> dict[str, Any]:
    """The reset row of a task directory: ``env.reset(options={"task": task_path(dir)})``."""
    return load_task(path).to_row()
