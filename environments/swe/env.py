"""SWE-v0: fix an issue in a real repository with a shell, graded by the repository's own hidden tests.

An episode is one SWE-bench row (``environments.swe.tasks``). The model gets the problem statement and
five tools on a per-episode workspace (``forge_env.workspace``): ``bash``, ``view``, ``edit``,
``create`` and ``submit``. ``submit`` (``state.request_end``) or a turn without tool calls ends the episode;
``grade_episode`` then grades the workspace's changes in a fresh sandbox run (``environments.swe.grading``): reward 1 when every
``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test passes (``reward_mode="resolved"``), or the passed fraction
(``reward_mode="fraction"``). An episode cut short by ``max_turns`` is graded as it stands (SWE-bench grades
whatever patch exists; ``grade_truncated=False``: not graded, reward 0).
``info["episode_summary"]`` carries ``resolved``, passed/total per list, the dropped files and the time
(and ``tampered`` when a canary test shows the outcomes were forged: reward 0, see ``canary.py``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from environments.swe.grading import Grade, grade
from environments.swe.repos import base_checkout, check_repo
from environments.swe.tasks import SWETask, load_swe_tasks, parse_task
from environments.swe.verdict import swebench_grading
from forge_env import EpisodeEnd, EpisodeState, TextEnv, Tool, ToolError, Verdict
from forge_env.sandbox import Sandbox, shared_sandbox
from forge_env.types import Message
from forge_env.workspace import GRACE_S, Workspace, WorkspaceError

RewardMode = Literal["resolved", "fraction"]

#: Limits of the shared SWE sandbox (per call; a session's tmpfs holds the workspace).
SANDBOX_DEFAULTS: dict[str, Any] = {"cpu_seconds": 120, "wall_timeout_s": 120, "memory_mb": 2048,
                                    "workdir_size_mb": 512, "max_output_bytes": 16 << 20, "max_processes": 64,
                                    "open_files": 256, "file_size_mb": 64, "max_files": 65536}

#: What the process backend's interpreter holds besides the standard library: the test runner and its
#: dependencies (a task set whose repositories need more adds them with ``sandbox_options={"packages": [...]}``).
SANDBOX_PACKAGES: tuple[str, ...] = ("pytest",)

#: The docker backend's image for SWE-v0 (python3, git and pytest: ``tools/docker_engine.sh swe-image``).
SWE_IMAGE_ENV = "FORGE_ENV_SWE_IMAGE"


def swe_image() -> str:
    return os.environ.get(SWE_IMAGE_ENV, "forge-env/swe:bookworm")


def swe_sandbox(backend: str = "process", **options: Any) -> Sandbox:
    """The process-wide sandbox SWE-v0 uses on ``backend`` (:data:`SANDBOX_DEFAULTS`, then ``options``)."""
    options = SANDBOX_DEFAULTS | options
    if backend == "docker":
        options.setdefault("image", swe_image())
    else:  # the process backend's interpreter holds only its allow-list (forge_env/sandbox/interpreter.py)
        options["packages"] = tuple(sorted({*SANDBOX_PACKAGES, *options.get("packages", ())}))
    return shared_sandbox(backend, **options)


SYSTEM_PROMPT = ("You are a software engineer working in a git repository. Use the tools to explore the code, "
                 "make a fix, and check it; call submit when the fix is done. Hidden tests will grade the "
                 "repository as you leave it; changes to the tests or to test configuration are ignored.")


def _spec(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


class SWEEnv(TextEnv):
    """Repository-level coding tasks (see the module docstring).

    Args:
        tasks: SWE-bench rows (dicts or :class:`SWETask`), or a ``.jsonl``/``.json`` path.
        dataset: alias of ``tasks`` for configs; ``"bundled"`` is the set shipped with forge-env.
        repos_dir: the directory of local mirrors ``<owner>__<name>`` (rows may give ``repo_path``).
        reward_mode: ``"resolved"`` (1/0, SWE-bench's resolved) or ``"fraction"``.
        bash_timeout: seconds per ``bash`` call; grading_timeout: seconds for the grading pytest run.
        sandbox / sandbox_backend / sandbox_options: where workspaces and grading run.
        spare_sessions: workspace sessions kept started ahead of need per sandbox (0: none).
        pytest_plugins: installed pytest plugins grading loads (``-p NAME``; say ``["asyncio"]``; on the
            process backend their packages must be allow-listed too: ``sandbox_options={"packages":
            ["pytest-asyncio"]}``, as must the repositories' own dependencies);
        pytest_autoload: load every installed plugin instead, as a bare ``pytest`` does (off: see grading).
        grade_truncated: grade the workspace of an episode cut by ``max_turns`` (or another limit) too, as
            SWE-bench grades whatever patch exists (default); False: such an episode earns 0, ungraded.
    """

    def __init__(self, tasks: Any = None, *, dataset: Any = None, repos_dir: str | Path | None = None,
                 reward_mode: RewardMode = "resolved", bash_timeout: float = 30.0,
                 grading_timeout: float = 300.0, sandbox: Sandbox | None = None,
                 sandbox_backend: str | None = None, sandbox_options: dict[str, Any] | None = None,
                 max_turns: int = 50, spare_sessions: int = 2, pytest_plugins: Sequence[str] = (),
                 pytest_autoload: bool = False, grade_truncated: bool = True, **kwargs: Any) -> None:
        if reward_mode not in ("resolved", "fraction"):
            raise ValueError(f"reward_mode must be 'resolved' or 'fraction', got {reward_mode!r}")
        source = tasks if tasks is not None else dataset
        if source is None or source == "bundled":
            from environments.swe.bundled import bundled_tasks
            source, repos_dir = bundled_tasks()
        parsed = load_swe_tasks(source)
        self.repos_dir = repos_dir
        for task in parsed:
            check_repo(task, repos_dir)
        self.swe_tasks = {t.instance_id: t for t in parsed}
        self.reward_mode = reward_mode
        self.spare_sessions = int(spare_sessions)
        self.bash_timeout = float(bash_timeout)
        self.grading_timeout = float(grading_timeout)
        if isinstance(pytest_plugins, str) or not all(isinstance(p, str) and re.fullmatch(r"[\w.:-]+", p)
                                                      for p in pytest_plugins):
            raise ValueError(f"pytest_plugins must be a list of plugin names, got {pytest_plugins!r}")
        self.pytest_plugins = tuple(pytest_plugins)
        self.pytest_autoload = bool(pytest_autoload)
        self.grade_truncated = bool(grade_truncated)
        swebench_grading()  # imported now (it imports docker's client), not in an episode's event loop
        if sandbox is None:
            sandbox = swe_sandbox(sandbox_backend or "process", **(sandbox_options or {}))
        missing = sorted(set(SANDBOX_PACKAGES) - set(getattr(sandbox, "packages", SANDBOX_PACKAGES)))
        if getattr(sandbox, "lean", False) and missing:
            # Grading without pytest would fail every task: the sandbox's interpreter holds only its allow-list.
            raise ValueError(f"the sandbox given to SWE-v0 runs an interpreter without {missing}: build it with "
                             f"make_sandbox('process', packages={list(SANDBOX_PACKAGES)!r}, ...) or let SWE-v0 "
                             f"make its own (sandbox_options=...)")
        self.sandbox = sandbox
        super().__init__(tasks=[t.to_row() | {"task_id": t.instance_id} for t in parsed],
                         system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT), max_turns=max_turns, **kwargs)

    # ------------------------------------------------------------------ tasks
    def task_of(self, task: dict[str, Any]) -> SWETask:
        found = self.swe_tasks.get(task.get("instance_id", ""))
        return found if found is not None and found.to_row().items() <= task.items() else parse_task(task)

    def validate_task(self, task: dict[str, Any]) -> dict[str, Any]:
        parsed = parse_task(task, "options['task']")
        check_repo(parsed, self.repos_dir)
        return dict(task) | {"task_id": parsed.instance_id}

    def initial_messages(self, task: dict[str, Any]) -> list[Message]:
        text = (f"<issue>\n{task['problem_statement'].strip()}\n</issue>\n\nThe repository is checked out in "
                f"your working directory (bash starts there; paths given to view/edit/create are relative to "
                f"it). Fix the issue in the source code, then call submit.")
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}]

    # ------------------------------------------------------------------ episode
    async def setup_episode(self, state: EpisodeState) -> None:
        task = self.task_of(state.task)
        checkout = base_checkout(task, self.repos_dir)
        workspace = state.data["workspace"] = Workspace(self.sandbox, checkout, spares=self.spare_sessions,
                                                        env=self.pytest_env())
        state.data["swe_task"] = task
        await workspace.start()

    async def teardown_episode(self, state: EpisodeState) -> None:
        workspace = state.data.pop("workspace", None)
        if workspace is not None:
            await workspace.close()

    def pytest_env(self) -> dict[str, str]:
        """The agent's ``pytest`` loads the plugins grading loads (``pytest_plugins``/``pytest_autoload``)."""
        env = {} if self.pytest_autoload else {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        if self.pytest_plugins:
            env["PYTEST_ADDOPTS"] = " ".join(f"-p {name}" for name in self.pytest_plugins)
        return env

    def episode_tools(self, state: EpisodeState) -> list[Tool]:
        def workspace() -> Workspace:
            return state.data["workspace"]

        async def guarded(coro: Any) -> str:
            try:
                return await coro
            except WorkspaceError as exc:
                raise ToolError(str(exc)) from None

        async def bash(command: str) -> str:
            return await guarded(workspace().bash(command, self.bash_timeout))

        async def view(path: str, start_line: int | None = None, end_line: int | None = None) -> str:
            return await guarded(workspace().view(path, start_line, end_line))

        async def edit(path: str, old_str: str, new_str: str) -> str:
            return await guarded(workspace().edit(path, old_str, new_str))

        async def create(path: str, content: str) -> str:
            return await guarded(workspace().create(path, content))

        async def submit() -> str:
            state.request_end("submitted")
            return "Submitted; the repository will be graded now."

        text = {"type": "string"}
        line = {"type": "integer"}
        slow = self.bash_timeout + GRACE_S + 60
        return [
            Tool("bash", f"Run a bash command in the repository (no network; {self.bash_timeout:g}s limit). "
                 "Returns its output and exit code.", _spec({"command": text}, ["command"]), bash, slow, True),
            Tool("view", "Show a file with line numbers (optionally lines start_line..end_line), or list a "
                 "directory.", _spec({"path": text, "start_line": line, "end_line": line}, ["path"]), view,
                 slow, True),
            Tool("edit", "Replace old_str, which must occur exactly once in the file, by new_str.",
                 _spec({"path": text, "old_str": text, "new_str": text}, ["path", "old_str", "new_str"]), edit,
                 slow, True),
            Tool("create", "Create (or overwrite) a file with the given content.",
                 _spec({"path": text, "content": text}, ["path", "content"]), create, slow, True),
            Tool("submit", "Finish: the repository is graded as it is now.", _spec({}, []), submit),
        ]

    async def grade_workspace(self, state: EpisodeState) -> Grade:
        """Snapshot the workspace, close it (its processes die with it), grade the snapshot."""
        workspace: Workspace = state.data["workspace"]
        snapshot = await workspace.snapshot()
        await workspace.close()
        result = await grade(self.sandbox, state.data["swe_task"], workspace.checkout, snapshot,
                             timeout=self.grading_timeout, pytest_plugins=self.pytest_plugins,
                             pytest_autoload=self.pytest_autoload)
        state.data["grade"] = result
        return result

    def reward_of(self, result: Grade) -> float:
        return float(result.resolved) if self.reward_mode == "resolved" else result.fraction

    def metrics_of(self, result: Grade) -> dict[str, float]:
        total = len(result.fail_to_pass) + len(result.pass_to_pass)
        return {"resolved": float(result.resolved), "pass_fraction": result.fraction, "tests": float(total),
                "dropped_files": float(len(result.dropped)),
                "grading_retries": float(result.retries), "worker_lost": float(result.worker_lost)}

    async def grade_episode(self, state: EpisodeState, end: EpisodeEnd) -> Verdict | None:
        """Grade the workspace however the episode ends: submit, a final answer, or a limit (SWE-bench grades
        whatever patch exists; ``grade_truncated=False``: a limit's episode is not graded, reward 0)."""
        if end.truncated and not self.grade_truncated:
            return None
        result = await self.grade_workspace(state)
        return Verdict(reward=self.reward_of(result), metrics=self.metrics_of(result), passed=result.resolved,
                       seconds=result.seconds, summary=result.summary())
