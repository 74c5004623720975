"""TextEnv: the multi-turn text environment contract (a ``gymnasium.Env``).

An episode is a chat. ``reset`` returns the opening messages (system + user) and the
tool specs in ``info["tools"]``; each ``step`` takes the assistant's turn and returns
the NEW messages it caused, with the gymnasium 5-tuple
``(observation, reward, terminated, truncated, info)``.

The turn rules live here so every environment gets them for free:

* an assistant turn with tool calls: each call is validated and executed (concurrently
  when independent, with a per-call timeout) and answered, in order, by a ``tool``
  message; output is truncated with a marker; the episode goes on;
* an assistant turn without tool calls is the final answer: :meth:`TextEnv.on_final_answer`
  scores it (by default through :meth:`TextEnv.grade_episode`, the rubric's score) and usually ends the
  episode (``terminated``);
* a tool that submits calls ``state.request_end(reason)``: the episode ends after that turn
  (``terminated``), even on a turn that reaches a limit;
* limits (``max_turns``, a character/token budget) cut the episode short (``truncated``,
  with ``info["truncation_reason"]``);
* otherwise :meth:`TextEnv.stop_condition` may end it (``terminated``).

However it ends, :meth:`TextEnv.grade_episode` (the one grading hook) is asked for a
:class:`~forge_env.core.verdict.Verdict`, told how (:class:`~forge_env.core.episode.EpisodeEnd`); its
reward, metrics and record join the ending step, whose ``info["episode_summary"]`` is built here, once,
and the episode's resources are released (:meth:`TextEnv.teardown_episode`).
* after a completed turn, an env that ``supports_snapshots`` gives the episode as plain data
  (:meth:`TextEnv.snapshot`), which :meth:`TextEnv.arestore` makes the running episode of a fresh instance
  (:mod:`forge_env.core.snapshots`; what lets a session survive the death of its replica).
* a bad action (malformed tool call, unknown tool, wrong arguments, a tool that raises or
  times out, an empty or oversized turn) is answered with an error message the model can
  read, never with an exception. Stepping a finished episode raises :class:`EpisodeEndedError`.

Subclasses implement :meth:`sample_task` (or pass ``tasks=``) and usually
:meth:`initial_messages` and a rubric (or :meth:`grade_episode`); see README "Write an environment".

The mechanics of a turn live in :mod:`forge_env.core.turns` (mixed into ``TextEnv``), the episode records
and errors in :mod:`forge_env.core.episode`; both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from forge_env.core.episode import (
    AnswerOutcome,
    EnvError,
    EpisodeEnd,
    EpisodeEndedError,
    EpisodeState,
    ResetNeededError,
    Task,
    TaskError,
)
from forge_env.core.rubric import Rubric
from forge_env.core.snapshots import SnapshotError, Snapshots
from forge_env.core.spaces import AssistantActionSpace, MessagesSpace
from forge_env.core.turns import TRUNCATION_MARKER, TurnRules, is_error_message
from forge_env.core.verdict import Verdict
from forge_env.tools import InfraError, Tool, get_parser
from forge_env.types import Message
from forge_env.utils.aio import run_sync

__all__ = [
    "TRUNCATION_MARKER",
    "AnswerOutcome",
    "EnvError",
    "EpisodeEnd",
    "EpisodeEndedError",
    "EpisodeState",
    "ResetNeededError",
    "SnapshotError",
    "Task",
    "TaskError",
    "TextEnv",
    "Verdict",
]


class TextEnv(TurnRules, Snapshots, gymnasium.Env):
    """Base class of multi-turn text environments. See the module docstring for the turn rules.

    Args:
        tasks: a fixed list of tasks to draw from (``sample_task`` picks one with the seeded RNG).
        tools: the tools offered in every episode (override :meth:`episode_tools` for per-task tools).
        rubric: scores the final answer; without one, the final answer earns 0.
        system_prompt: prepended as a system message by the default :meth:`initial_messages`.
        max_turns: assistant turns before the episode is truncated (reason ``"max_turns"``).
        max_episode_chars: character budget of the whole conversation (reason ``"max_chars"``).
        max_episode_tokens / token_counter: the same budget in tokens, counted by ``token_counter``.
        max_action_chars: a longer assistant turn is refused with an error message.
        tool_timeout: seconds a tool call may take (a tool's own ``timeout`` wins).
        max_tool_calls: tool calls per episode; later calls are answered with an error.
        max_tool_output_chars: tool output beyond this is cut, with a marker saying how much.
        parallel_tool_calls: run several calls of one turn concurrently (answers keep their order).
        turn_tool_time_s: wall-clock seconds all tool calls of one turn may take together (None: no bound).
            A call still running when it runs out is stopped, and later calls are not started; each is an
            ``Error:`` the model reads. It bounds a step, so a turn of many slow calls (each within its own
            deadline) cannot outlast a rollout's ``step_timeout_s`` and be masked as the machine's failure.
        tool_parser: parser for raw-text actions: a name from ``forge_env.tools.parser_names()`` (``"hermes"``,
            ``"llama3_json"``, ``"mistral"``, ``"deepseek_v3"``, ``"harmony"``, ``"kimi_k2"``) or a callable.
        invalid_action_penalty: subtracted from the step reward for each error in a turn.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}

    def __init__(
        self,
        *,
        tasks: Sequence[Task] | None = None,
        tools: Sequence[Tool] = (),
        rubric: Rubric | None = None,
        system_prompt: str | None = None,
        max_turns: int = 8,
        max_episode_chars: int | None = None,
        max_episode_tokens: int | None = None,
        token_counter: Callable[[str], int] | None = None,
        max_action_chars: int = 16_000,
        tool_timeout: float = 10.0,
        max_tool_calls: int | None = None,
        max_tool_output_chars: int = 4_000,
        parallel_tool_calls: bool = True,
        turn_tool_time_s: float | None = 30.0,
        tool_parser: str | Callable = "hermes",
        invalid_action_penalty: float = 0.0,
        render_mode: str | None = None,
    ):
        super().__init__()
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        if turn_tool_time_s is not None and not turn_tool_time_s > 0:
            raise ValueError(f"turn_tool_time_s must be positive or None, got {turn_tool_time_s}")
        if max_episode_tokens is not None and token_counter is None:
            raise ValueError("max_episode_tokens needs a token_counter (e.g. lambda s: len(tokenizer.encode(s)))")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.tasks = list(tasks) if tasks is not None else None
        self.tools = list(tools)
        self.rubric = rubric
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.max_episode_chars = max_episode_chars
        self.max_episode_tokens = max_episode_tokens
        self.token_counter = token_counter
        self.max_action_chars = max_action_chars
        self.tool_timeout = tool_timeout
        self.max_tool_calls = max_tool_calls
        self.max_tool_output_chars = max_tool_output_chars
        self.parallel_tool_calls = parallel_tool_calls
        self.turn_tool_time_s = turn_tool_time_s
        self.parse_action_text = get_parser(tool_parser)
        self.invalid_action_penalty = invalid_action_penalty
        self.render_mode = render_mode
        self.observation_space = MessagesSpace()
        self.action_space = AssistantActionSpace()
        self.state: EpisodeState | None = None
        self._episode_tools: dict[str, Tool] = {}

    # ----------------------------------------------------------------- hooks for subclasses
    def sample_task(self, rng: np.random.Generator) -> Task:
        """Draw a task with the episode's seeded RNG. Default: pick from ``tasks``."""
        if not self.tasks:
            raise NotImplementedError(
                f"{type(self).__name__} has no task source: pass tasks=[...] or override sample_task(rng)"
            )
        return self.tasks[int(rng.integers(len(self.tasks)))]

    def validate_task(self, task: Task) -> Task:
        """Check a user-supplied task; raise :class:`TaskError` naming what is missing. Default: must be a dict."""
        if not isinstance(task, dict):
            raise TaskError(f"a task must be a dict, got {type(task).__name__}")
        return task

    def initial_messages(self, task: Task) -> list[Message]:
        """The opening messages. Default: the system prompt, then the task's ``prompt`` or ``question``."""
        text = task.get("prompt", task.get("question"))
        if not isinstance(text, str):
            raise TaskError(f"{type(self).__name__}: task has no 'prompt' or 'question' string; override initial_messages")
        opening: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*opening, {"role": "user", "content": text}]

    def episode_tools(self, state: EpisodeState) -> list[Tool]:
        """The tools offered in this episode. Default: the constructor's ``tools``."""
        return self.tools

    async def setup_episode(self, state: EpisodeState) -> None:
        """Acquire per-episode resources (a sandbox session, ...). Called by ``areset``."""

    async def teardown_episode(self, state: EpisodeState) -> None:
        """Release what :meth:`setup_episode` acquired. Called when the episode ends, on reset and on close."""

    async def on_final_answer(self, message: Message, state: EpisodeState) -> AnswerOutcome:
        """Decide on an assistant turn without tool calls. Default: :meth:`grade_episode` grades it (with the
        rubric unless overridden; no verdict: reward 0) and the episode ends. Override for multi-attempt logic
        (``done=False`` lets the episode go on)."""
        verdict = await self._graded(state, EpisodeEnd("answer", "final_answer"))
        if verdict is None:
            return AnswerOutcome(reward=0.0, done=True)
        return AnswerOutcome(reward=verdict.reward, done=True, metrics=dict(verdict.metrics))

    async def grade_episode(self, state: EpisodeState, end: EpisodeEnd) -> Verdict | None:
        """The grading hook: the verdict on an episode that ends as ``end`` says (a final answer, a tool's
        :meth:`~EpisodeState.request_end`, a :meth:`stop_condition`, or a limit: ``end.truncated``). The base
        class adds its reward to the ending step, its metrics to ``info["metrics"]``, its ``summary`` to
        ``info["episode_summary"]`` and its ``info`` to the step's info. None: no reward (a limit's default).
        Default: the rubric scores the final answer (``end.kind == "answer"``); anything else earns nothing."""
        if self.rubric is None or end.kind != "answer":
            return None
        text = state.messages[-1].get("content", "") if state.messages else ""
        return await self.rubric.score(text, state.task, state.messages, state)

    async def stop_condition(self, state: EpisodeState) -> str | None:
        """Checked after each turn that neither ended the episode nor reached a limit: a reason (a name) ends
        it, ``terminated`` and graded by :meth:`grade_episode` (``EpisodeEnd("stop", reason)``). Default: never."""
        return None

    async def _graded(self, state: EpisodeState, end: EpisodeEnd) -> Verdict | None:
        """:meth:`grade_episode`, recorded as the episode's verdict (``state.verdict``)."""
        verdict = await self.grade_episode(state, end)
        if verdict is not None:
            state.verdict = verdict
        return verdict

    # ----------------------------------------------------------------- async API
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                     ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: ``options={"task": task}`` runs that exact task, else one is drawn with ``seed``."""
        super().reset(seed=seed)
        if self.state is not None and not self.state.released:
            await self._teardown()
        options = options or {}
        task = self.validate_task(options["task"]) if "task" in options else self.sample_task(self.np_random)
        state = EpisodeState(task=task)
        opening = self.initial_messages(task)
        state.messages.extend(opening)
        state.chars = sum(len(m.get("content") or "") for m in opening)
        self.state = state
        tools = self.episode_tools(state)
        self._episode_tools = {t.name: t for t in tools}
        await self.setup_episode(state)
        info = {"tools": [t.spec for t in tools], "turn": 0}
        if "task_id" in task:
            info["task_id"] = task["task_id"]
        return [dict(m) for m in opening], info  # type: ignore[misc]

    async def astep(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Take the assistant's turn; return ``(new_messages, reward, terminated, truncated, info)``.

        An :class:`InfraError` (a tool or the grading failed because of the machine) ends the
        episode and propagates: it is neither an observation nor a reward.
        """
        state = self.state
        if state is None:
            raise ResetNeededError("call reset() before step()")
        if state.done:
            raise EpisodeEndedError("this episode has ended (terminated or truncated); call reset() to start another")
        try:
            return await self._take_turn(state, action)
        except InfraError:
            state.done = True
            if not state.released:
                await self._teardown()
            raise

    async def _take_turn(self, state: EpisodeState, action: Message | str
                         ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        state.turn += 1
        message, errors = self._normalise_action(action)
        state.messages.append(message)
        state.chars += len(message.get("content") or "")
        observation: list[Message] = []
        reward = 0.0
        terminated = False
        outcome_metrics: dict[str, float] = {}
        if errors and not message.get("tool_calls"):
            state.format_errors += len(errors)
            observation.append({"role": "user", "content": "Error: " + "\n".join(errors)})
        elif message.get("tool_calls"):
            state.format_errors += len(errors)
            observation.extend(await self._answer_tool_calls(message["tool_calls"], state, errors))
            if errors:
                observation.append({"role": "user", "content": "Error: " + "\n".join(errors)})
        else:
            outcome = await self.on_final_answer(message, state)
            reward = float(outcome.reward)
            terminated = bool(outcome.done)
            observation.extend(outcome.messages)
            outcome_metrics = dict(outcome.metrics)
            state.metrics.update(outcome_metrics)
        step_errors = errors + [m["content"] for m in observation if m.get("name") and is_error_message(m)]
        penalty = self.invalid_action_penalty * len(step_errors)
        reward -= penalty
        state.messages.extend(observation)
        state.chars += sum(len(m.get("content") or "") for m in observation)
        state.total_reward += reward

        info: dict[str, Any] = {"turn": state.turn, "tool_calls": state.tool_calls, "tool_errors": state.tool_errors}
        if step_errors:
            info["errors"] = step_errors
        if penalty:
            info["penalty"] = penalty
        if outcome_metrics:
            info["metrics"] = outcome_metrics
        truncated = False
        if not terminated:
            end = await self._end_of(state)
            if end is not None:
                terminated, truncated = not end.truncated, end.truncated
                if end.truncated:
                    info["truncation_reason"] = end.reason
                verdict = await self._graded(state, end)
                if verdict is not None:
                    reward += verdict.reward
                    state.total_reward += verdict.reward
                    state.metrics.update(verdict.metrics)
                    info["metrics"] = {**info.get("metrics", {}), **verdict.metrics}
        if terminated or truncated:
            await self._finish(state, info)
        return [dict(m) for m in observation], reward, terminated, truncated, info  # type: ignore[misc]

    async def _end_of(self, state: EpisodeState) -> EpisodeEnd | None:
        """How a turn that gave no final answer ends the episode, if it does: a tool's request, a limit, a stop
        condition, in that order."""
        if state.end_request is not None:
            return EpisodeEnd("request", state.end_request)
        reason = self._truncation_reason(state)
        if reason:
            return EpisodeEnd("limit", reason)
        stop = await self.stop_condition(state)
        return None if stop is None else EpisodeEnd("stop", stop)

    async def _finish(self, state: EpisodeState, info: dict[str, Any]) -> None:
        """The end of every episode: the summary (with the verdict's record), then the teardown."""
        state.done = True
        info["episode_summary"] = {"return": state.total_reward, "turns": state.turn, "tool_calls": state.tool_calls,
                                   "tool_errors": state.tool_errors, "format_errors": state.format_errors}
        if state.verdict is not None:
            info["episode_summary"].update(state.verdict.summary)
            info.update(state.verdict.info)
        await self._teardown()

    async def arestore(self, snapshot: dict[str, Any]) -> None:
        """Continue the episode in ``snapshot`` (from :meth:`snapshot`, perhaps of another instance in another
        process): the next ``astep`` answers as the snapshotted env would have. A running episode of this env is
        released first; the episode's tools are rebuilt by :meth:`episode_tools`. ``SnapshotError`` if the env does
        not support snapshots or ``snapshot`` is not one of its episodes."""
        state = self.restored_state(snapshot)
        if self.state is not None and not self.state.released:
            await self._teardown()
        self.state = state
        self._episode_tools = {t.name: t for t in self.episode_tools(state)}

    async def aclose(self) -> None:
        """Release the running episode's resources."""
        if self.state is not None and not self.state.released:
            await self._teardown()

    # ----------------------------------------------------------------- sync gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Message | str):  # type: ignore[override]
        return run_sync(self.astep(action))

    def restore(self, snapshot: dict[str, Any]) -> None:
        run_sync(self.arestore(snapshot))

    def close(self) -> None:
        run_sync(self.aclose())

    def render(self) -> str | None:
        """``render_mode="ansi"``: the conversation so far as text."""
        if self.render_mode != "ansi" or self.state is None:
            return None
        return "\n".join(f"[{m['role']}] {m.get('content', '')}" for m in self.state.messages)

    # ----------------------------------------------------------------- episode resources
    async def _teardown(self) -> None:
        assert self.state is not None
        self.state.released = True
        await self.teardown_episode(self.state)
