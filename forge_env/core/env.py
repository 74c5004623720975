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
  scores it (by default with the rubric) and usually ends the episode (``terminated``);
* limits (``max_turns``, a character/token budget) cut the episode short (``truncated``,
  with ``info["truncation_reason"]``);
* a bad action (malformed tool call, unknown tool, wrong arguments, a tool that raises or
  times out, an empty or oversized turn) is answered with an error message the model can
  read, never with an exception. Stepping a finished episode raises :class:`EpisodeEndedError`.

Subclasses implement :meth:`sample_task` (or pass ``tasks=``) and usually
:meth:`initial_messages` and a rubric; see README "Write an environment".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np

from forge_env.core.rubric import Rubric
from forge_env.core.spaces import AssistantActionSpace, MessagesSpace
from forge_env.tools import InfraError, Tool, ToolArgumentError, ToolError, get_parser
from forge_env.types import (
    Message,
    MessageFormatError,
    ToolCall,
    content_text,
    tool_message,
    validate_message,
)
from forge_env.utils.aio import run_sync

Task = dict[str, Any]


class EnvError(RuntimeError):
    """Base class for misuse of an environment (not for bad actions, which become observations)."""


class ResetNeededError(EnvError):
    """``step`` was called before ``reset``."""


class EpisodeEndedError(EnvError):
    """``step`` was called after the episode terminated or was truncated; call ``reset`` first."""


class TaskError(ValueError):
    """A task passed through ``reset(options={"task": ...})`` does not have the fields this environment needs."""


@dataclass
class EpisodeState:
    """Everything an environment knows about the running episode. ``data`` is free for subclasses."""

    task: Task
    messages: list[Message] = field(default_factory=list)
    turn: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    format_errors: int = 0
    chars: int = 0
    total_reward: float = 0.0
    done: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    released: bool = False


@dataclass
class AnswerOutcome:
    """What :meth:`TextEnv.on_final_answer` decides: the reward, whether the episode ends, and any reply."""

    reward: float
    done: bool = True
    messages: list[Message] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


TRUNCATION_MARKER = "\n[... output truncated: {dropped} more characters]"


class TextEnv(gymnasium.Env):
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
        tool_parser: str | Callable = "hermes",
        invalid_action_penalty: float = 0.0,
        render_mode: str | None = None,
    ):
        super().__init__()
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
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
        """Score an assistant turn without tool calls. Default: the rubric's reward; the episode ends."""
        if self.rubric is None:
            return AnswerOutcome(reward=0.0, done=True)
        result = await self.rubric.score(message.get("content", ""), state.task, state.messages, state)
        return AnswerOutcome(reward=result.reward, done=True, metrics=result.metrics)

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
        step_errors = errors + [m["content"] for m in observation if m.get("name") and _is_error(m)]
        penalty = self.invalid_action_penalty * len(step_errors)
        reward -= penalty
        state.messages.extend(observation)
        state.chars += sum(len(m.get("content") or "") for m in observation)
        state.total_reward += reward

        truncated = False
        info: dict[str, Any] = {"turn": state.turn, "tool_calls": state.tool_calls, "tool_errors": state.tool_errors}
        if not terminated:
            reason = self._truncation_reason(state)
            if reason:
                truncated = True
                info["truncation_reason"] = reason
        if step_errors:
            info["errors"] = step_errors
        if penalty:
            info["penalty"] = penalty
        if outcome_metrics:
            info["metrics"] = outcome_metrics
        if terminated or truncated:
            state.done = True
            info["episode_summary"] = {"return": state.total_reward, "turns": state.turn, "tool_calls": state.tool_calls,
                               "tool_errors": state.tool_errors, "format_errors": state.format_errors}
            await self._teardown()
        return [dict(m) for m in observation], reward, terminated, truncated, info  # type: ignore[misc]

    async def aclose(self) -> None:
        """Release the running episode's resources."""
        if self.state is not None and not self.state.released:
            await self._teardown()

    # ----------------------------------------------------------------- sync gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Message | str):  # type: ignore[override]
        return run_sync(self.astep(action))

    def close(self) -> None:
        run_sync(self.aclose())

    def render(self) -> str | None:
        """``render_mode="ansi"``: the conversation so far as text."""
        if self.render_mode != "ansi" or self.state is None:
            return None
        return "\n".join(f"[{m['role']}] {m.get('content', '')}" for m in self.state.messages)

    # ----------------------------------------------------------------- turn mechanics
    def _normalise_action(self, action: Any) -> tuple[Message, list[str]]:
        """Turn a raw string or message dict into an assistant message plus a list of problems found."""
        errors: list[str] = []
        if isinstance(action, str):
            if len(action) > self.max_action_chars:
                return ({"role": "assistant", "content": action[: self.max_action_chars]},
                        [f"your message is {len(action)} characters; the limit is {self.max_action_chars}"])
            parsed = self.parse_action_text(action)
            message: Message = {"role": "assistant", "content": parsed.content}
            if parsed.reasoning is not None:
                message["reasoning_content"] = parsed.reasoning
            if parsed.tool_calls:
                message["tool_calls"] = parsed.tool_calls
            errors.extend(parsed.errors)
            raw_empty = not action.strip()
        else:
            try:
                validate_message(action)
            except MessageFormatError as exc:
                return {"role": "assistant", "content": ""}, [f"invalid action: {exc}"]
            text = content_text(action.get("content"))  # list-of-parts content (openai SDK) becomes its text
            if action["role"] != "assistant":
                return {"role": "assistant", "content": text}, [
                    f"invalid action: the role must be 'assistant', got {action['role']!r}"]
            message = {"role": "assistant", "content": text}
            if action.get("tool_calls"):
                message["tool_calls"] = [dict(c) for c in action["tool_calls"]]  # type: ignore[misc]
            if len(message["content"]) > self.max_action_chars:
                errors.append(f"your message is {len(message['content'])} characters; the limit is {self.max_action_chars}")
                message = {"role": "assistant", "content": message["content"][: self.max_action_chars]}
            raw_empty = not message["content"].strip() and not action.get("tool_calls")
        if raw_empty and not errors:
            errors.append("your message was empty; answer the question or call a tool")
        return message, errors

    async def _answer_tool_calls(self, calls: list[ToolCall], state: EpisodeState, errors: list[str]) -> list[Message]:
        """Execute the calls (concurrently if allowed) and return one tool message per call, in call order."""
        budget_left = None if self.max_tool_calls is None else max(self.max_tool_calls - state.tool_calls, 0)
        jobs = []
        for index, call in enumerate(calls):
            if budget_left is not None and index >= budget_left:
                jobs.append(_constant(f"Error: tool-call budget of {self.max_tool_calls} calls per episode is used up"))
            else:
                jobs.append(self._execute_call(call))
        state.tool_calls += len(calls)
        if self.parallel_tool_calls:
            outputs = await asyncio.gather(*jobs)
        else:
            outputs = [await job for job in jobs]
        replies = []
        for call, (text, failed) in zip(calls, outputs, strict=True):
            state.tool_errors += failed
            function = call.get("function", {})
            replies.append(tool_message(text, call.get("id", ""), function.get("name", "")))
        return replies

    async def _execute_call(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call; return (text for the model, whether it failed). Never raises."""
        function = call.get("function", {})
        name = function.get("name", "")
        tool = self._episode_tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._episode_tools)) or "none"
            return f"Error: unknown tool {name!r}. Available tools: {known}", True
        raw_arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(raw_arguments) if isinstance(raw_arguments, str) else raw_arguments
        except json.JSONDecodeError as exc:
            return f"Error: arguments for {name} are not valid JSON ({exc.msg})", True
        except (RecursionError, ValueError):  # nested past the recursion limit, an integer past the digit limit
            return f"Error: arguments for {name} are nested too deeply or hold a number too large", True
        timeout = tool.timeout if tool.timeout is not None else self.tool_timeout
        try:
            result = await asyncio.wait_for(tool(**arguments) if isinstance(arguments, dict)
                                            else _raise_argument_type(name, arguments), timeout)
        except ToolArgumentError as exc:
            return f"Error: {exc}", True
        except ToolError as exc:
            return f"Error: {exc}", True
        except TimeoutError:
            if tool.timeout_is_infra:
                raise InfraError(f"tool {name} outlived its own deadline plus grace ({timeout:g} s): "
                                 "the machine held it up") from None
            return f"Error: tool {name} timed out after {timeout:g} s", True
        except InfraError:
            raise  # the machine failed, not the model: not an observation (see InfraError)
        except Exception as exc:  # a tool's bug is reported to the model, not raised into the episode
            return f"Error: tool {name} raised {type(exc).__name__}: {exc}", True
        return self._truncate_output(_to_text(result)), False

    def _truncate_output(self, text: str) -> str:
        limit = self.max_tool_output_chars
        if len(text) <= limit:
            return text
        return text[:limit] + TRUNCATION_MARKER.format(dropped=len(text) - limit)

    def _truncation_reason(self, state: EpisodeState) -> str | None:
        if state.turn >= self.max_turns:
            return "max_turns"
        if self.max_episode_chars is not None and state.chars > self.max_episode_chars:
            return "max_chars"
        if self.max_episode_tokens is not None and self.token_counter is not None:
            used = sum(self.token_counter(m.get("content") or "") for m in state.messages)
            if used > self.max_episode_tokens:
                return "max_tokens"
        return None

    async def _teardown(self) -> None:
        assert self.state is not None
        self.state.released = True
        await self.teardown_episode(self.state)


def _is_error(message: Message) -> bool:
    return message.get("role") == "tool" and (message.get("content") or "").startswith("Error:")


async def _constant(text: str) -> tuple[str, bool]:
    return text, True


async def _raise_argument_type(name: str, arguments: Any) -> Any:
    raise ToolArgumentError(f"{name}: arguments must be a JSON object, got {type(arguments).__name__}")


def _to_text(result: Any) -> str:
    """Tool results become text for the model: strings as they are, everything else as JSON where possible."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
