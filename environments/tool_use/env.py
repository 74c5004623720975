"""ToolUse-v0: answer questions about a synthetic knowledge base with search, read and a calculator.

Each episode gets a fresh, seeded world of fictional entities written as short documents
(see :mod:`environments.tool_use.knowledge`). The question needs ``hops`` documents and
arithmetic, so the model has to search, read, compute and answer over several turns;
independent look-ups can go in one turn as parallel tool calls. The final answer is
scored 1 when its number is right, else 0, with ``tool_calls``, ``tool_errors`` and
``turns`` reported as metrics.

``env.expert_action()`` gives the ideal next assistant turn for the running episode and
:func:`expert_demonstrations` whole expert episodes for an SFT warm-up, as for Arithmetic-v0.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from environments.tool_use.knowledge import MAX_HOPS, generate_task
from environments.tool_use.search import DocumentIndex
from forge_env import EpisodeState, Message, TaskError, Tool, ToolEnv
from forge_env.core.demonstrations import demonstrate
from forge_env.sandbox.repl import PythonREPL
from forge_env.tools.calculator import calculator
from forge_env.tools.parsers import load_json
from forge_env.types import assistant_message, make_tool_call
from forge_env.utils.aio import run_sync

SYSTEM_PROMPT = "Look the facts up with the tools. End with: Answer: <number>"


class ToolUseEnv(ToolEnv):
    """Multi-hop questions over a seeded synthetic knowledge base (``forge_env/ToolUse-v0``).

    Args:
        hops: documents a question needs, 1 to 4; a list draws one per task (default ``(1, 2, 3)``).
        distractors: extra documents not needed for the answer (half of them with near-identical
            names); a ``(low, high)`` pair draws a count per task.
        python: also offer the sandboxed ``python`` REPL tool (one interpreter per episode).
        max_results: documents listed per search.
        **kwargs: :class:`~forge_env.TextEnv` options (``max_turns`` defaults to 10).

    Episodes snapshot and restore (``supports_snapshots``: the tools are rebuilt from the task), except with
    ``python``, whose interpreter's state a snapshot cannot hold.
    """

    supports_snapshots = True

    def __init__(
        self,
        hops: int | Sequence[int] = (1, 2, 3),
        distractors: int | tuple[int, int] = 4,
        python: bool = False,
        max_results: int = 5,
        system_prompt: str = SYSTEM_PROMPT,
        **kwargs: Any,
    ):
        self.hops = [hops] if isinstance(hops, int) else [int(h) for h in hops]
        if not self.hops or any(not 1 <= h <= MAX_HOPS for h in self.hops):
            raise ValueError(f"hops must be between 1 and {MAX_HOPS} (or a list of such), got {hops!r}")
        self.distractors = (distractors, distractors) if isinstance(distractors, int) else tuple(distractors)
        if len(self.distractors) != 2 or not 0 <= self.distractors[0] <= self.distractors[1]:
            raise ValueError(f"distractors must be a count or a (low, high) pair with 0 <= low <= high, got {distractors!r}")
        self.python = python
        self.supports_snapshots = not python
        self.max_results = max_results
        kwargs.setdefault("max_turns", 10)
        super().__init__(tools=[calculator], tasks=self._generate, system_prompt=system_prompt, **kwargs)

    def _generate(self, rng: np.random.Generator) -> dict[str, Any]:
        hops = self.hops[int(rng.integers(len(self.hops)))]
        low, high = self.distractors
        return generate_task(rng, hops=hops, distractors=int(rng.integers(low, high + 1)))

    def validate_task(self, task: Any) -> dict[str, Any]:
        task = super().validate_task(task)
        missing = [key for key in ("question", "answer", "documents") if key not in task]
        if missing:
            raise TaskError(f"a ToolUse task needs 'question', 'answer' and 'documents'; missing {missing}")
        documents = task["documents"]
        if not isinstance(documents, list) or not all(
                isinstance(d, dict) and all(isinstance(d.get(key), str) for key in ("id", "title", "text"))
                for d in documents):
            raise TaskError("each ToolUse document must be a dict with string 'id', 'title' and 'text'")
        return task

    def episode_tools(self, state: EpisodeState) -> list[Tool]:
        """``search`` and ``read`` over this task's documents, the shared tools, then (if asked) ``python``."""
        tools = [*DocumentIndex(state.task["documents"], self.max_results).tools(), *self.tools]
        if self.python:
            # One interpreter per episode, so no state leaks between episodes; closed in teardown_episode.
            repl = state.data["repl"] = PythonREPL()
            tools.append(repl.tool)
        return tools

    async def teardown_episode(self, state: EpisodeState) -> None:
        repl = state.data.pop("repl", None)
        if repl is not None:
            await repl.close()
        await super().teardown_episode(state)

    # ----------------------------------------------------------------- expert
    def expert_action(self, observation: Sequence[Message] | EpisodeState | None = None) -> Message:
        """The ideal next assistant turn for the running episode (a message with deterministic call ids).

        The expert follows the task's plan: search for the names of one level, read their
        documents, then the next level, then the calculator, then ``Answer: N``. It resumes
        after the last plan step the conversation has completed, so it also works from a
        conversation that strayed. Pass the latest observation (the running episode's log is
        used), a whole conversation, or an EpisodeState; with nothing, the running episode.
        """
        state = observation if isinstance(observation, EpisodeState) else self.state
        if state is None:
            raise RuntimeError("call reset() before expert_action(), or pass an EpisodeState")
        messages = _conversation(observation, state)
        task = state.task
        if "plan" not in task:
            raise TaskError("this task has no 'plan', so there is no expert for it; generate tasks with generate_task")
        turns = expert_turns(task)
        done = _completed_calls(messages)
        progress = max((i + 1 for i, turn in enumerate(turns) if all(_key(c) in done for c in turn)), default=0)
        if progress >= len(turns):
            return assistant_message(f"Answer: {task['answer']}")
        calls = [make_tool_call(name, arguments, f"call_{zlib.crc32(_key((name, arguments)).encode()):08x}")
                 for name, arguments in turns[progress]]
        return assistant_message("", calls)


def _conversation(observation: Sequence[Message] | EpisodeState | None, state: EpisodeState) -> Sequence[Message]:
    """The whole conversation: the episode's log when ``observation`` is (the tail of) it, else ``observation``."""
    if observation is None or isinstance(observation, EpisodeState):
        return state.messages
    observed = list(observation)
    if not observed or state.messages[len(state.messages) - len(observed):] == observed:
        return state.messages
    return observed


def expert_turns(task: dict[str, Any]) -> list[list[tuple[str, dict[str, Any]]]]:
    """The expert's tool-call turns for a task: per level, a search turn and a read turn; then the calculator."""
    turns: list[list[tuple[str, dict[str, Any]]]] = []
    for level in task["plan"]["lookups"]:
        turns.append([("search", {"query": item["name"]}) for item in level])
        turns.append([("read", {"doc_id": item["doc_id"]}) for item in level])
    turns.append([("calculator", {"expression": task["plan"]["expression"]})])
    return turns


def _key(call: tuple[str, dict[str, Any]]) -> str:
    name, arguments = call
    return name + json.dumps(arguments, sort_keys=True)


_SCALARS = (str, int, float, bool, type(None))


def _flat_arguments(raw: Any) -> dict[str, Any] | None:
    """A call's arguments when they are a flat JSON object (the only shape a plan step has), else None.

    Checked without recursion: text nested deeper than one object is refused by a linear scan before
    ``json.loads`` sees it, so a policy-written argument nested thousands deep (which the env answers
    with an error) is passed over, not a RecursionError in the expert.
    """
    if isinstance(raw, str):
        if _nesting_depth(raw) > 1:
            return None
        value, _ = load_json(raw or "{}")
    else:
        value = raw
    if isinstance(value, dict) and all(isinstance(v, _SCALARS) for v in value.values()):
        return value
    return None


def _nesting_depth(text: str) -> int:
    """The deepest nesting of JSON objects and arrays in ``text`` (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _completed_calls(messages: Iterable[Message]) -> set[str]:
    """Keys of the tool calls in ``messages`` that got an answer that is not an error."""
    issued: dict[str, str] = {}
    done: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            arguments = _flat_arguments(function.get("arguments") or "{}")
            if arguments is None:  # malformed or nested: no plan step looks like it
                continue
            issued[call.get("id", "")] = _key((function.get("name", ""), arguments))
        if message.get("role") == "tool" and not (message.get("content") or "").startswith("Error:"):
            key = issued.get(message.get("tool_call_id", ""))
            if key:
                done.add(key)
    return done


def expert_demonstrations(seed_range: range | tuple[int, int], **env_kwargs: Any) -> list[dict[str, Any]]:
    """Expert conversations for an SFT warm-up, one per reset seed in ``seed_range``.

    Each item is ``{"messages": [system, user, assistant(tool calls), tool, ..., assistant(answer)],
    "tools": [tool specs], "task": task}`` (the "messages"/"tools" layout of chat SFT datasets).
    ``env_kwargs`` set the difficulty as for :class:`ToolUseEnv`. Hold evaluation out by using
    another seed range.
    """
    seeds = range(*seed_range) if isinstance(seed_range, tuple) else seed_range
    env = ToolUseEnv(**env_kwargs)

    async def collect() -> list[dict[str, Any]]:
        return [await demonstrate(env, seed=seed) for seed in seeds]

    return run_sync(collect())

