"""Run harness processes against a gateway: one episode per process, trajectories back with rewards.

``run_harnesses(gateway, server, HarnessSpec(command="mini ... {base_url} ..."), n=8, reward=fn)`` opens ``n``
episodes, starts the command once per episode (``{base_url}``, ``{episode_id}`` and ``{api_key}`` filled in
per argument after splitting, so a value is never parsed by a shell; ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
``FORGE_ENV_EPISODE_ID`` are set too), waits for each within ``timeout_s`` and finishes its episode with the
reward ``reward(trajectory, result)`` gives (0 without one). It is the building block of a training rollout
source that runs an unmodified harness per episode.

Outcomes: exit 0 -> ``ok``; past ``timeout_s`` -> killed (its whole process group), ``ok`` and truncated
(``deadline``): a policy can make its harness run long, so that is graded, not masked; any other exit or a
harness that never called the model -> ``error`` with the end of its output (not trained on).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shlex
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agents.gateway.core import AgentGateway
from agents.rollout import TRUNCATED_DEADLINE
from agents.trajectory import STATUS_ERROR, STATUS_INFRA_ERROR, STATUS_OK, Trajectory

#: Characters of a harness's output kept for its result.
OUTPUT_TAIL = 16_384


@dataclass
class HarnessSpec:
    """How to start one harness process: a command template (a string split like a shell would, or a list)."""

    command: str | list[str]
    timeout_s: float = 600.0
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    api_key: str = "forge-env"


@dataclass
class HarnessResult:
    episode_id: str
    returncode: int | None
    output: str
    timed_out: bool = False


RewardFn = Callable[[Trajectory, HarnessResult], float | Awaitable[float]]


def harness_argv(spec: HarnessSpec, base_url: str, episode_id: str, **extra: Any) -> list[str]:
    """The command of one episode: the template split first, then each argument filled in (``extra``: more
    names a template may use, e.g. a task's ``seed``)."""
    parts = shlex.split(spec.command) if isinstance(spec.command, str) else list(spec.command)
    if not parts:
        raise ValueError("the harness command is empty")
    values = {**extra, "base_url": base_url, "episode_id": episode_id, "api_key": spec.api_key}
    try:
        return [part.format(**values) for part in parts]
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"the harness command may use {sorted('{' + k + '}' for k in values)} only: {exc}") from None


async def run_harness(gateway: AgentGateway, server: Any, spec: HarnessSpec, reward: RewardFn | None = None,
                      env: Any = None, env_seed: int | None = None, **metadata: Any) -> Trajectory:
    """One episode: open it, run the harness against its base URL, finish it with the reward.

    With ``env`` (a ``TextEnv``), the environment's episode (reset with ``env_seed``) is attached to the gateway
    episode: the harness runs its tools (``/e/{episode}/env/tools/{name}``), the template may use ``{task}`` (the
    opening user message) and ``{task_id}``, and the reward is the environment's grade (``reward`` is not used).
    """
    episode_id = gateway.open_episode(**metadata)
    if env is not None:
        try:
            opening = await gateway.envs.attach(episode_id, env, seed=env_seed)
        except BaseException:
            await gateway.finish(episode_id, status=STATUS_ERROR)
            raise
        task = env.state.task
        metadata = {**metadata, "task": next((m.get("content") or "" for m in reversed(opening)
                                              if m.get("role") == "user"), "")}
        if isinstance(task.get("task_id"), str | int):
            metadata["task_id"] = task["task_id"]
    base_url = server.episode_url(episode_id)
    try:
        argv = harness_argv(spec, base_url, episode_id,
                            **{k: v for k, v in metadata.items() if isinstance(v, str | int)})
        result = await _run(spec, argv, base_url, episode_id)
    except BaseException:
        await gateway.finish(episode_id, status=STATUS_ERROR)
        if env is not None:
            await gateway.envs.finish(episode_id, grade=False)
        raise
    status, error = STATUS_OK, None
    if not result.timed_out and result.returncode != 0:
        status, error = STATUS_ERROR, f"the harness exited with {result.returncode}: {result.output[-2000:]}"
    trajectory = await gateway.finish(episode_id, reward=0.0, status=status, error=error)
    if "task_id" in metadata:
        trajectory.task["task_id"] = metadata["task_id"]
    if not trajectory.turns and status == STATUS_OK:
        trajectory.status = STATUS_ERROR
        trajectory.error = f"the harness never called the model: {result.output[-2000:]}"
    if result.timed_out:
        trajectory.truncated = True
        trajectory.truncation_reason = TRUNCATED_DEADLINE
    trajectory.metrics["harness_returncode"] = float(-1 if result.returncode is None else result.returncode)
    if env is not None:  # the environment grades what the harness left (never when the harness failed)
        outcome = await gateway.envs.finish(episode_id, grade=trajectory.ok)
        if outcome.infra_error is not None:
            trajectory.status, trajectory.error = STATUS_INFRA_ERROR, outcome.infra_error
        elif trajectory.ok:
            trajectory.reward = outcome.reward
            trajectory.metrics.update({**outcome.metrics, "env_graded": float(outcome.graded),
                                       "env_truncated": float(outcome.truncated)})
    elif reward is not None and trajectory.ok:
        value = reward(trajectory, result)
        trajectory.reward = float(await value if inspect.isawaitable(value) else value)
    return trajectory


async def run_harnesses(gateway: AgentGateway, server: Any, spec: HarnessSpec, n: int,
                        reward: RewardFn | None = None, concurrency: int | None = None,
                        **metadata: Any) -> list[Trajectory]:
    """``n`` episodes, at most ``concurrency`` harnesses at a time (default: all)."""
    limit = asyncio.Semaphore(concurrency or n)

    async def one() -> Trajectory:
        async with limit:
            return await run_harness(gateway, server, spec, reward, **metadata)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def _run(spec: HarnessSpec, argv: list[str], base_url: str, episode_id: str) -> HarnessResult:
    env = {**os.environ, **spec.env, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": spec.api_key,
           "FORGE_ENV_EPISODE_ID": episode_id}
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=spec.cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    tail = bytearray()

    async def drain() -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            tail.extend(chunk)
            del tail[:-OUTPUT_TAIL]

    reader = asyncio.ensure_future(drain())
    timed_out = False
    try:
        await asyncio.wait_for(process.wait(), spec.timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        if process.returncode is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the harness and whatever it started
            except ProcessLookupError:
                pass
            await process.wait()
        try:
            await asyncio.wait_for(reader, 5)
        except TimeoutError:  # a grandchild holds the pipe open
            reader.cancel()
    code = None if timed_out else process.returncode
    return HarnessResult(episode_id, code, tail.decode(errors="replace"), timed_out)
