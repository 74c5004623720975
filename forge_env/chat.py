"""ChatRenderer: chat messages + tool specs -> token ids with the model's jinja2 chat template.

``render_prompt`` is exactly ``tokenizer.apply_chat_template(messages, tools=tools,
add_generation_prompt=True)``. ``render_continuation`` is the incremental path of a multi-turn episode:
the conversation's tokens so far end with the generator's sampled tokens (kept verbatim, never
re-tokenized), and it returns only the tokens to append: the rest of the template's end-of-turn markup
(when the sample stopped early), the env's new messages, and the next generation prompt.

How the continuation is found: the template renders a probe conversation (system/tools, a user turn, an
assistant turn holding a sentinel) with and without the new messages; the text after the probe
assistant's end-of-turn markup is what the new messages add. A template is *prefix-preserving* when the
longer render starts with the shorter one. Templates that are not (Qwen3's drops the reasoning of earlier
turns once a new user message arrives) still get a continuation anchored on the sentinel, but it is an
explicit fallback: counted in ``stats["non_prefix_preserving"]`` and warned about once, because the
episode's tokens then differ from what a full re-render of its messages would give (the model keeps
seeing its own earlier tokens). ``strict=True`` raises ``NonPrefixPreservingTemplateError`` instead.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

from forge_env.tools.parsers import ParsedAction, ToolCallParser, parse_tool_calls
from forge_env.types import Message

# Plain ASCII that no tokenizer merges with its neighbours across the markup around it.
_SENTINEL = "FORGE_ENV_PROBE_7f3a"
_PROBE_USER: Message = {"role": "user", "content": "FORGE_ENV_PROBE_USER"}


def _probe() -> list[Message]:
    return [dict(_PROBE_USER), {"role": "assistant", "content": _SENTINEL}]


class NonPrefixPreservingTemplateError(ValueError):
    """The chat template re-renders earlier turns differently once new messages arrive (``strict=True``)."""


class NonPrefixPreservingTemplateWarning(UserWarning):
    """Incremental rendering fell back to the sentinel-anchored continuation."""


class TemplateProbeError(ValueError):
    """The chat template could not be probed (it drops assistant content or renders no end-of-turn)."""


class ChatRenderer:
    """Render chat messages to token ids with a HF tokenizer's chat template, incrementally.

    ``parser`` names the tool-call parser for the model's format (``"hermes"``/``"qwen"`` by default).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        parser: str | ToolCallParser = "hermes",
        chat_template: str | None = None,
        strict: bool = False,
    ) -> None:
        if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat template; pass chat_template= or use a chat checkpoint"
            )
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.parser = parser
        self.strict = strict
        self.stats: dict[str, int] = {
            "prompts": 0,
            "continuations": 0,
            "non_prefix_preserving": 0,
            "closed_turns": 0,
        }
        self._end_of_turn: dict[str, tuple[str, list[int]]] = {}
        self._warned = False

    # ----------------------------------------------------------------- full rendering

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (and ``tools``)."""
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """Token ids of the full conversation (equal to ``tokenizer.apply_chat_template``)."""
        return self._encode(self.render_text(messages, tools, add_generation_prompt))

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
        """Token ids of the first prompt of an episode, ending with the generation prompt."""
        self.stats["prompts"] += 1
        return self.render(messages, tools, add_generation_prompt=True)

    # ----------------------------------------------------------------- incremental rendering

    def render_continuation(
        self, token_ids: Sequence[int], new_messages: Sequence[Message], tools: Sequence[dict] | None = None
    ) -> list[int]:
        """Tokens to append to ``token_ids`` (ending in a sampled assistant turn) for ``new_messages``.

        The result closes the assistant turn if the sample did not (e.g. it hit ``max_tokens``), renders the
        new messages and ends with the generation prompt, so ``token_ids + result`` is the next prompt.
        """
        if not new_messages:
            raise ValueError("render_continuation needs at least one new message (the env's reply)")
        self.stats["continuations"] += 1
        end_text, end_ids = self._assistant_end(tools)
        probe = _probe()
        before = self.render_text(probe, tools)
        after = self.render_text([*probe, *new_messages], tools, add_generation_prompt=True)
        anchor = after.find(_SENTINEL + end_text)
        if anchor < 0:
            raise TemplateProbeError("the chat template drops the assistant content of earlier turns")
        added = after[anchor + len(_SENTINEL) + len(end_text) :]
        if not after.startswith(before):
            self._not_prefix_preserving()
        elif after[len(before) :] != added:  # the probe turn ends with more than its end-of-turn markup
            raise TemplateProbeError(
                "the chat template adds text after an assistant turn that cannot be located"
            )
        return self._close_turn(token_ids, end_ids) + self._encode(added)

    def _assistant_end(self, tools: Sequence[dict] | None) -> tuple[str, list[int]]:
        """The template's markup after an assistant message's content (``<|im_end|>\\n`` for Qwen)."""
        key = json.dumps(tools or [], sort_keys=True)
        if key not in self._end_of_turn:
            text = self.render_text(_probe(), tools)
            at = text.rfind(_SENTINEL)
            if at < 0:
                raise TemplateProbeError("the chat template does not render the assistant's content")
            end_text = text[at + len(_SENTINEL) :]
            self._end_of_turn = {
                key: (end_text, self._encode(end_text))
            }  # one tool set per episode: keep one
        return self._end_of_turn[key]

    def _close_turn(self, token_ids: Sequence[int], end_ids: list[int]) -> list[int]:
        """The part of the end-of-turn markup that the sampled tokens did not already produce."""
        for produced in range(min(len(end_ids), len(token_ids)), 0, -1):
            if list(token_ids[-produced:]) == end_ids[:produced]:
                return end_ids[produced:]
        self.stats["closed_turns"] += 1
        return list(end_ids)

    def _not_prefix_preserving(self) -> None:
        self.stats["non_prefix_preserving"] += 1
        message = (
            "the chat template is not prefix-preserving (it re-renders earlier turns once new messages arrive, "
            "e.g. dropping earlier reasoning); continuing incrementally from the sampled tokens, so the "
            "episode's tokens differ from a full re-render of its messages"
        )
        if self.strict:
            raise NonPrefixPreservingTemplateError(message + "; pass strict=False to allow this")
        if not self._warned:
            self._warned = True
            warnings.warn(message, NonPrefixPreservingTemplateWarning, stacklevel=3)

    # ----------------------------------------------------------------- the assistant's side

    def decode_assistant(self, sampled_ids: Sequence[int]) -> str:
        """The text of a sampled assistant turn (control tokens such as the end-of-turn token dropped)."""
        return self.tokenizer.decode(list(sampled_ids), skip_special_tokens=True)

    def parse(self, text: str) -> ParsedAction:
        """Split assistant text into content, tool calls and parse errors with the model's parser."""
        return parse_tool_calls(text, self.parser)

    def parse_assistant(self, text: str) -> Message:
        """The assistant ``Message`` for ``text``: content plus the well-formed tool calls."""
        parsed = self.parse(text)
        message: Message = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        return message

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
