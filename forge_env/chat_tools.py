"""Chat templates without tool support: where tool specs, tool calls and tool results go instead.

Many small instruct models ship a plain ChatML template (SmolLM2's is
``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, nothing else): it ignores ``tools=``, drops an
assistant message's ``tool_calls`` and may or may not render a ``tool`` role. :func:`probe_support` finds out,
once per renderer, which of the three the template renders, and :func:`template_messages` moves what it does
not render into the messages themselves, so that the template's own rendering of the resulting messages is
the context the model sees:

1. **Tool specs** (when ``tools=`` renders nothing): a system message lists them, in the words and markup of
   the model's tool-call format (Hermes: the tools' JSON schemas inside ``<tools></tools>`` and how to write a
   ``<tool_call>``, as Qwen2.5's template writes it). An opening system message keeps its text and gets the
   listing after a blank line; without one, the listing is the system message.
2. **Tool calls** (when ``tool_calls`` render nothing): an assistant turn is its text as sampled (the call
   markup stays in ``content``, token-exact); a message that holds structured ``tool_calls`` gets them written
   into its content in the format's markup.
3. **Tool results** (when a ``tool`` message renders nothing, or the template refuses one): each becomes a
   user message holding ``<tool_response>\\n{content}\\n</tool_response>``. A template that renders the
   ``tool`` role (SmolLM2's renders any role) keeps it.

The rule is idempotent (a listing already in the system message is not added again), so the messages a
rollout records (``ChatRenderer.template_messages``) re-render, with the tokenizer's own
``apply_chat_template(messages, add_generation_prompt=True)`` and no ``tools=``, to exactly the episode's
context. It applies to a template without tool support, i.e. one that renders no tool calls; a template that
renders calls is left alone, its messages and tools pass through unchanged (DeepSeek-R1's renders calls and
results but not ``tools=``: its system prompt is where a user lists them, as before).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from forge_env.types import Message

_PROBE_TOOL = "forge_env_probe_tool"
_PROBE_RESULT = "FORGE_ENV_PROBE_RESULT"
_PROBE_ID = "fp0call9x"  # nine alphanumerics: Mistral refuses other ids
_PROBE_ARG = "forge_env_probe_arg"

#: The system text that lists tools for a model whose calls the Hermes parser reads (Qwen2.5's wording).
HERMES_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>")


_RESPONSE_OPEN, _RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"


def is_tool_result(message: Message) -> bool:
    """A tool result: a ``tool`` message, or the user message it becomes for a template that renders no ``tool``
    role (rule 3), as a trajectory records it."""
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return (message.get("role") == "user" and isinstance(content, str) and content.startswith(_RESPONSE_OPEN)
            and content.endswith(_RESPONSE_CLOSE))


class UnsupportedToolFormatError(ValueError):
    """A template without tool support, and a tool-call format this module cannot write tools in."""


@dataclass(frozen=True)
class TemplateSupport:
    """What a chat template renders of the tool protocol."""

    tools: bool
    calls: bool
    tool_role: bool

    @property
    def none(self) -> bool:
        """The template has no tool support: it renders no tool calls (the rules here apply)."""
        return not self.calls


def probe_support(render: Callable[[list[Message], Sequence[dict] | None], str]) -> TemplateSupport:
    """Which parts of the tool protocol the template renders (``render(messages, tools) -> text``)."""
    user: Message = {"role": "user", "content": "hi"}
    spec = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                             "parameters": {"type": "object", "properties": {}}}}
    # A template may render a call's name or only its id and arguments (Kimi-K2): any of them counts.
    call = {"id": _PROBE_ID, "type": "function", "function": {"name": _PROBE_TOOL, "arguments": {_PROBE_ARG: 1}}}
    tools = _renders(render, [user], [spec], _PROBE_TOOL)
    calls = _renders(render, [user, {"role": "assistant", "content": "", "tool_calls": [call]}], None,
                     _PROBE_TOOL, _PROBE_ID, _PROBE_ARG)
    assistant: Message = ({"role": "assistant", "content": "", "tool_calls": [call]} if calls  # type: ignore[typeddict-item]
                          else {"role": "assistant", "content": "ok"})
    result: Message = {"role": "tool", "content": _PROBE_RESULT, "tool_call_id": _PROBE_ID, "name": _PROBE_TOOL}  # type: ignore[typeddict-item]
    tool_role = _renders(render, [user, assistant, result], [spec] if tools else None, _PROBE_RESULT)
    return TemplateSupport(tools=tools, calls=calls, tool_role=tool_role)


def _renders(render: Callable[[list[Message], Sequence[dict] | None], str], messages: list[Message],
             tools: Sequence[dict] | None, *needles: str) -> bool:
    try:
        text = render(messages, tools)
        return any(needle in text for needle in needles)
    except Exception:  # a template that raises on the construct (jinja's raise_exception) does not render it
        return False


def tools_prompt(tools: Sequence[dict], parser: Any) -> str:
    """The system text that lists ``tools`` for a model whose calls ``parser`` reads."""
    if parser != "hermes":
        raise UnsupportedToolFormatError(
            f"the chat template renders no tools, and forge-env writes tool listings only in the Hermes format "
            f"(<tool_call> JSON, parser 'hermes'), not for parser {parser!r}: pass parser='hermes', or a "
            f"chat_template= that renders tools")
    return HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def template_messages(messages: Sequence[Message], tools: Sequence[dict] | None, support: TemplateSupport,
                      parser: Any) -> tuple[list[Message], list[dict] | None]:
    """``(messages, tools)`` as the template is given them: unchanged when it renders tool calls, else with what
    it does not render moved into the messages (the rules in the module docstring)."""
    messages = list(messages)
    if not support.none:
        return messages, list(tools) if tools else None
    out: list[Message] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            out.append(_calls_in_content(message))
        elif role == "tool" and not support.tool_role:
            out.append({"role": "user", "content": f"{_RESPONSE_OPEN}{message.get('content') or ''}{_RESPONSE_CLOSE}"})
        else:
            out.append(message)
    if tools and not support.tools:
        listing = tools_prompt(tools, parser)
        if out and out[0].get("role") == "system":
            content = out[0].get("content") or ""
            if listing not in content:
                out[0] = {**out[0], "content": f"{content}\n\n{listing}" if content else listing}  # type: ignore[typeddict-item]
        else:
            out.insert(0, {"role": "system", "content": listing})
        return out, None
    return out, list(tools) if tools else None


def _calls_in_content(message: Message) -> Message:
    parts = [message.get("content") or ""]
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": "\n".join(p for p in parts if p)}  # type: ignore[typeddict-item]
