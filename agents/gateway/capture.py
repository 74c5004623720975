"""Token-exact capture of one gateway episode: a harness's chat calls -> one :class:`Trajectory`.

A harness sends the whole conversation on every call; the gateway holds the tokens of the conversation so far.
Per call:

* the first call renders the messages with the chat template (``render_prompt``);
* a call whose messages are the previous call's messages + the assistant message the gateway returned +
  new messages renders only the new ones (``render_continuation``), so every sampled token stays verbatim
  and the generator's session reuses its KV cache;
* anything else (a truncated, summarised or rewritten history, other tools, a re-sent call) is a history
  edit: a drift of kind ``history_edited`` is recorded (where and why) and a new context segment starts.
  The new segment is rendered with every assistant message the gateway sampled in this episode spliced in
  as its sampled ids (found by the message, never by re-encoding its text); the spliced ids are context of
  the new segment, not trained on twice.

After every prompt the renderer's drift check compares the segment's tokens with a full re-render of its
messages, as the rollout does (``agents.rollout.check_drift_into``). With a template without tool support the
trajectory records each segment's messages as the template saw them (``template_shown``), as the rollout does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from agents.rollout import check_drift_into
from agents.trajectory import Trajectory, Turn
from forge_env.chat_drift import TemplateDrift
from forge_env.generation.base import Completion
from forge_env.types import Message

#: Drift kind of a history the harness edited (the tokens start a new segment).
HISTORY_EDITED = "history_edited"
#: At most this many characters of a message are quoted in a drift record.
_QUOTE = 48


def message_key(message: Message) -> str:
    """What identifies a message across calls: role, text, tool calls (arguments as canonical JSON), tool ids.

    ``content`` ``None`` and ``""`` are the same; fields a chat template does not render (``refusal``,
    ``annotations``) are left out; an assistant message's ``reasoning_content`` counts only where the harness
    sends it back.
    """
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                pass
        calls.append([call.get("id"), function.get("name"), arguments])
    key = [message.get("role"), message.get("content") or "", calls, message.get("tool_call_id"),
           message.get("name") if message.get("role") == "tool" else None]
    if message.get("reasoning_content"):
        key.append(message["reasoning_content"])
    return json.dumps(key, sort_keys=True, ensure_ascii=False)


def no_tool_support(renderer: Any) -> bool:
    """The renderer's template renders no tool calls (:mod:`forge_env.chat_tools`; a renderer that does not say
    has support)."""
    return getattr(getattr(renderer, "support", None), "none", False) is True


def template_shown(renderer: Any, messages: list[Message], tools: list[dict] | None) -> list[Message]:
    """``messages`` as a template without tool support sees them (the trajectory records these: its tokenizer's
    own ``apply_chat_template`` of them is the episode's context). ``tools`` only for a segment's first call (the
    listing goes into its system message); a continuation's new messages take ``None``."""
    return renderer.template_messages(messages, tools)[0]


def _without_reasoning(message: Message) -> Message:
    return {k: v for k, v in message.items() if k != "reasoning_content"}  # type: ignore[return-value]


@dataclass
class Sampled:
    """An assistant message the gateway returned, with the ids sampled for it and its raw text."""

    ids: list[int]
    text: str


@dataclass
class EpisodeCapture:
    """The token state of one episode: the trajectory, the conversation the tokens hold, the sampled replies."""

    trajectory: Trajectory
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    expected: list[Message] | None = None
    """The previous call's messages + the assistant message returned (what an extending call starts with)."""
    segment_messages: list[Message] = field(default_factory=list)
    """The current segment's conversation, sampled assistant turns as raw text (what the drift check renders)."""
    tools: list[dict[str, Any]] | None = None
    sampled: dict[str, Sampled] = field(default_factory=dict)
    calls: int = 0

    # ------------------------------------------------------------------ before a call: the prompt
    def prompt(self, renderer: Any, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """Append what ``messages`` add to the episode's tokens; return the prompt of this call."""
        trajectory = self.trajectory
        tools = tools or None
        self._prompt_start = len(trajectory.token_ids)
        edit = None if self.expected is None else self._edit(messages, tools)
        if self.expected is not None and edit is None:  # the history extends: render only the new messages
            new = messages[len(self.expected):]
            continuation = renderer.render_continuation(trajectory.context_ids, new, tools)
            self.segment_messages.extend(self._raw(m) for m in new)
            trajectory.messages.extend(template_shown(renderer, new, None) if no_tool_support(renderer) else new)
            rerendered = check_drift_into(renderer, trajectory, trajectory.context_ids + continuation,
                                          list(tools or []), self.segment_messages)
            if rerendered is None:
                trajectory.append_context(continuation)
            else:  # reasoning="rerender": the template's own render starts a new segment, as in the rollout
                trajectory.start_segment(rerendered)
            return trajectory.context_ids
        ids = self._splice(renderer, messages, tools)
        if self.expected is None:
            trajectory.tools = list(tools or [])
            trajectory.append_context(ids)
        else:
            trajectory.start_segment(ids)
            self._record_edit(*edit, messages)  # type: ignore[misc]
        self.tools = tools
        self.segment_messages = [self._raw(m) for m in messages]
        # A template without tool support: the messages as it saw them (sampled turns as their raw text).
        trajectory.messages.extend(template_shown(renderer, self.segment_messages, tools)
                                   if no_tool_support(renderer) else messages)
        rerendered = check_drift_into(renderer, trajectory, trajectory.context_ids, list(tools or []),
                                      self.segment_messages)
        if rerendered is not None:
            trajectory.start_segment(rerendered)
        return trajectory.context_ids

    _prompt_start: int = 0

    def checkpoint(self) -> tuple:
        """The state before a call, for :meth:`restore` when its generation fails (the harness may retry it)."""
        t = self.trajectory
        return (len(t.token_ids), list(t.segment_starts), len(t.drift), len(t.messages), list(self.segment_messages),
                self.tools, list(t.tools))

    def restore(self, state: tuple) -> None:
        tokens, segments, drift, messages, segment_messages, tools, trajectory_tools = state
        t = self.trajectory
        del t.token_ids[tokens:], t.loss_mask[tokens:], t.logprobs[tokens:], t.drift[drift:], t.messages[messages:]
        t.segment_starts[:] = segments
        t.tools = trajectory_tools
        self.segment_messages, self.tools = segment_messages, tools

    def _edit(self, messages: list[Message], tools: list[dict] | None) -> tuple[int, str] | None:
        """``None`` when ``messages`` extend the expected history, else (first differing message, why)."""
        expected = self.expected or []
        if (tools or None) != (self.tools or None):
            return 0, "the tools changed"
        for index, (sent, held) in enumerate(zip(messages, expected, strict=False)):
            if sent == held:  # the common case, without building the keys
                continue
            if message_key(sent) != message_key(held) and message_key(sent) != message_key(
                    _without_reasoning(held)):
                return index, f"message {index} ({sent.get('role')}) differs from the one held"
        if len(messages) < len(expected):
            return len(messages), f"{len(messages)} messages sent where the history holds {len(expected)}"
        if len(messages) == len(expected):
            return len(messages), "no new message after the last assistant reply (a re-sent call)"
        return None

    def _record_edit(self, where: int, why: str, messages: list[Message]) -> None:
        expected = self.expected or []
        held = json.dumps(expected[where], ensure_ascii=False)[:_QUOTE] if where < len(expected) else ""
        sent = json.dumps(messages[where], ensure_ascii=False)[:_QUOTE] if where < len(messages) else ""
        trajectory = self.trajectory
        drift = TemplateDrift(token_index=0, kind=HISTORY_EDITED, held=held, rendered=sent)
        record = trajectory.record_drift(drift, offset=trajectory.segment_starts[-1])
        if record is not None:  # the new segment's messages follow in ``trajectory.messages`` from messages_offset
            record.update(message_index=where, why=why, segment=len(trajectory.segment_starts) - 1,
                          messages_offset=len(trajectory.messages))

    def _raw(self, message: Message) -> Message:
        """A sampled assistant message as the raw text sampled (what the drift check parses), others as sent."""
        known = self._known(message)
        return message if known is None else {"role": "assistant", "content": known.text}

    def _known(self, message: Message) -> Sampled | None:
        if message.get("role") != "assistant":
            return None
        return self.sampled.get(message_key(message))

    def _splice(self, renderer: Any, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """The prompt for ``messages`` with each assistant message this episode sampled as its sampled ids.

        Rendered piecewise like a rollout (prompt, sampled ids, continuation, ...); where that is not possible
        (a sampled message first or two in a row, or the conversation ends with one) the whole conversation
        is rendered by the template (those turns re-encoded; the drift check reports what that changes).
        """
        ids: list[int] | None = None
        pending: list[Message] = []
        for message in messages:
            known = self._known(message)
            if known is None:
                pending.append(message)
                continue
            if not pending:
                return renderer.render_prompt(messages, tools)
            ids = renderer.render_prompt(pending, tools) if ids is None else ids + renderer.render_continuation(
                ids, pending, tools)
            ids = ids + known.ids
            pending = []
        if not pending:
            return renderer.render_prompt(messages, tools)
        if ids is None:
            return renderer.render_prompt(pending, tools)
        return ids + renderer.render_continuation(ids, pending, tools)

    # ------------------------------------------------------------------ after a call: the reply
    def record(self, completion: Completion, reply: Message, text: str, messages: list[Message],
               generation_s: float) -> Turn:
        """Append the sampled ids of ``completion`` (returned as ``reply``) and remember them for later calls."""
        trajectory = self.trajectory
        gen_start = len(trajectory.token_ids)
        trajectory.append_sampled(completion.token_ids, completion.logprobs)
        turn = Turn(prompt_start=self._prompt_start, gen_start=gen_start, gen_end=len(trajectory.token_ids),
                    policy_version=completion.policy_version, finish_reason=completion.finish_reason,
                    num_cached_tokens=completion.num_cached_tokens, generation_s=generation_s)
        trajectory.turns.append(turn)
        trajectory.generation_s += generation_s
        trajectory.messages.append({"role": "assistant", "content": text})
        trajectory.endpoint_retries += int(completion.metrics.get("retries", 0))
        sampled = Sampled(list(completion.token_ids), text)
        self.sampled[message_key(reply)] = sampled
        self.sampled.setdefault(message_key(_without_reasoning(reply)), sampled)  # a harness may drop the reasoning
        self.segment_messages.append({"role": "assistant", "content": text})
        self.expected = [*messages, reply]
        self.calls += 1
        self.last_used = time.monotonic()
        return turn
