"""ChatRenderer: chat messages + tool specs -> token ids with the model's jinja2 chat template.

``render_prompt`` is exactly ``tokenizer.apply_chat_template(messages, tools=tools,
add_generation_prompt=True)``. ``render_continuation`` is the incremental path of a multi-turn episode:
the conversation's tokens so far end with the generator's sampled tokens (kept verbatim, never
re-tokenized), and it returns only the tokens to append: the rest of the template's end-of-turn markup
(when the sample stopped early), the env's new messages, and the next generation prompt.

How the continuation is found: the template renders a probe conversation (a user turn, then an assistant
turn shaped like the one that was sampled: plain, or calling the tools the new ``tool`` messages answer,
with a sentinel at the end of its content or arguments) followed by the new messages. The text after the
sentinel and the template's in-history end-of-turn markup is what the new messages add. Whether the
sampled turn already produced its end-of-turn markup (``<|im_end|>``, ``<|eot_id|>``, ``<|call|>``,
``<|return|>``…) is read off the sampled turn's decoded text (:mod:`forge_env.chat_endings`).

Whether the result is token-exact is decided on the real conversation, not the probe:
:meth:`ChatRenderer.check_drift` re-renders the episode's messages and compares them with the tokens it
holds (:mod:`forge_env.chat_drift`); the rollout calls it after every continuation and records each new
divergence in the trajectory (``Trajectory.drift``). The episode keeps its sampled tokens either way.

Reasoning models (Qwen3, DeepSeek-R1, gpt-oss) drop earlier reasoning when they re-render, so a choice is
needed, made per renderer with ``reasoning=``:

* ``"keep"`` (default): the sampled reasoning stays in context, token-exact to what the policy saw; the
  template's dropping is reported as drift of kind ``reasoning_dropped`` (a declared choice: ``strict``
  does not raise for it);
* ``"rerender"``: the rollout starts a new context segment rendered as the template would (what the model
  sees when served), so every segment is token-exact to a re-render; the trajectory holds each segment's
  tokens, sampled tokens verbatim, and trains on each segment as its own sequence.

``strict=True`` raises :class:`NonPrefixPreservingTemplateError` on any other drift.

A template without tool support (SmolLM2's plain ChatML) gets the tool specs, calls and results in the messages
themselves (:mod:`forge_env.chat_tools`); :meth:`ChatRenderer.template_messages` is what it renders.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from forge_env.chat_drift import (
    CONTROL_TOKEN,
    REASONING_DROPPED,
    TemplateDrift,
    cut_control_tokens,
    find_drift,
    structured,
    with_text_arguments,
)
from forge_env.chat_endings import (
    Ending,
    assistant_text,
    control_token_ids,
    missing_ending,
    template_stop_ids,
)
from forge_env.chat_tools import TemplateSupport, probe_support, template_messages
from forge_env.tools.parsers import ParsedAction, ToolCallParser, detect_parser, get_parser
from forge_env.types import Message

# Plain ASCII that no tokenizer merges with its neighbours across the markup around it.
_SENTINEL = "FORGE_ENV_PROBE_7f3a"
_PROBE_USER: Message = {"role": "user", "content": "FORGE_ENV_PROBE_USER"}
_PROBE_ARG = "FORGE_ENV_PROBE_ARG"
#: Characters that close the JSON of a call's arguments (stripped to find the markup after a call).
_JSON_CLOSERS = "\"}] "
#: Reasoning modes of a renderer.
REASONING_MODES = ("keep", "rerender")


class NonPrefixPreservingTemplateError(ValueError):
    """The chat template re-renders earlier turns differently once new messages arrive (``strict=True``)."""


class NonPrefixPreservingTemplateWarning(UserWarning):
    """An episode's tokens differ from a full re-render of its messages (warned once per renderer)."""


class TemplateProbeError(ValueError):
    """The chat template could not be probed (it drops assistant content or renders no end-of-turn)."""


class ChatRenderer:
    """Render chat messages to token ids with a HF tokenizer's chat template, incrementally.

    Args:
        parser: the tool-call parser for the model's format (a name from ``forge_env.tools.parser_names()``
            or a callable); ``None`` detects it from the chat template's markup.
        chat_template: a template to use instead of the tokenizer's.
        strict: raise :class:`NonPrefixPreservingTemplateError` when an episode drifts from the template
            (other than the dropped reasoning that ``reasoning="keep"`` declares).
        reasoning: ``"keep"`` or ``"rerender"`` (see the module docstring).
        check_drift: compare each continuation with a full re-render of the conversation (one render and
            one tokenization of the whole conversation per turn).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        parser: str | ToolCallParser | None = None,
        chat_template: str | None = None,
        strict: bool = False,
        reasoning: str = "keep",
        check_drift: bool = True,
    ) -> None:
        template = chat_template or getattr(tokenizer, "chat_template", None)
        if template is None:
            raise ValueError(
                "the tokenizer has no chat template; pass chat_template= or use a chat checkpoint"
            )
        if reasoning not in REASONING_MODES:
            raise ValueError(f"reasoning must be one of {REASONING_MODES}, got {reasoning!r}")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        # A tokenizer may hold several named templates (Hermes-3's "default" and "tool_use"): detect on all.
        markup = template if isinstance(template, str) else " ".join(str(t) for t in dict(template).values())
        self.parser = parser if parser is not None else detect_parser(markup)
        self._parse = get_parser(self.parser)
        self.strict = strict
        self.reasoning = reasoning
        self.drift_checks = check_drift
        self.stats: dict[str, int] = {
            "prompts": 0,
            "continuations": 0,
            "non_prefix_preserving": 0,
            "closed_turns": 0,
            "drift_checks": 0,
            "reasoning_dropped": 0,
            "control_tokens": 0,
            "retokenized": 0,
        }
        self._probes: dict[str, tuple[list[Message], str, list[Ending]]] = {}
        self._control_ids: set[int] | None = None
        self._control_texts_cache: list[str] | None = None
        self._alone: dict[str, str] = {}
        self._warned = False
        self._text_arguments = False  # the template concatenates tool-call arguments as strings
        self._support: TemplateSupport | None = None

    # ----------------------------------------------------------------- full rendering

    def render_text(self, messages: Sequence[Message], tools: Sequence[dict] | None = None,
                    add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (and ``tools``; where it renders none, :meth:`template_messages`).

        Tool-call arguments given as objects are passed as JSON text to a template that concatenates them as
        strings (DeepSeek-V3.1's ``'<｜tool▁sep｜>' + arguments``), which fails on an object with a TypeError.
        """
        messages, tools = self.template_messages(messages, tools)
        if self._text_arguments:
            messages = with_text_arguments(messages)
        try:
            return self._apply(messages, tools, add_generation_prompt)
        except TypeError:
            as_text = with_text_arguments(messages)
            if self._text_arguments or as_text == messages:
                raise
            text = self._apply(as_text, tools, add_generation_prompt)
            self._text_arguments = True
            return text

    @property
    def support(self) -> TemplateSupport:
        """Which parts of the tool protocol the template renders (probed once; :mod:`forge_env.chat_tools`)."""
        if self._support is None:
            self._support = TemplateSupport(True, True, True)  # the probe itself renders the template as it is
            self._support = probe_support(lambda messages, tools: self.render_text(messages, tools))
        return self._support

    def template_messages(self, messages: Sequence[Message], tools: Sequence[dict] | None = None
                          ) -> tuple[list[Message], list[dict] | None]:
        """``(messages, tools)`` as the template gets them: unchanged for a template that renders tools, calls
        and tool results; else with the tool specs (and what else it drops) moved into the messages."""
        return template_messages(messages, tools, self.support, self.parser)

    def _apply(self, messages: list[Message], tools: Sequence[dict] | None, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=list(tools) if tools else None, tokenize=False,
                                                  chat_template=self.chat_template,
                                                  add_generation_prompt=add_generation_prompt)

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
        probe, mid, endings = self._probe(new_messages, tools)
        after = self.render_text([*probe, *new_messages], tools, add_generation_prompt=True)
        anchor = after.find(_SENTINEL + mid)
        if anchor < 0:
            raise TemplateProbeError(
                "the chat template drops or rewrites the assistant content of earlier turns; "
                "incremental rendering cannot locate where the new messages start")
        added = after[anchor + len(_SENTINEL) + len(mid):]
        return self._close_turn(token_ids, endings) + self._encode(added)

    def _probe(self, new_messages: Sequence[Message], tools: Sequence[dict] | None
               ) -> tuple[list[Message], str, list[Ending]]:
        """The probe conversation for these new messages, the in-history end markup after its sentinel, and
        the candidate end-of-turn markups of a sampled turn of that shape (most likely first)."""
        answered = []
        for message in new_messages:
            if message.get("role") != "tool" or not self.support.calls:  # calls it drops stay in the content
                break
            answered.append(message)
        key = repr((tools or [], [(m.get("name"), m.get("tool_call_id")) for m in answered]))
        if key in self._probes:
            return self._probes[key]
        if answered:
            calls = [{"id": m.get("tool_call_id") or f"call_{i}", "type": "function",
                      "function": {"name": m.get("name") or "tool",
                                   "arguments": {_PROBE_ARG: _SENTINEL} if i == len(answered) - 1 else {}}}
                     for i, m in enumerate(answered)]
            assistant: Message = {"role": "assistant", "content": "", "tool_calls": calls}  # type: ignore[typeddict-item]
        else:
            assistant = {"role": "assistant", "content": _SENTINEL}
        probe = [dict(_PROBE_USER), assistant]
        with_prompt = self.render_text(probe, tools, add_generation_prompt=True)
        last = self.render_text(probe, tools)
        prompt = self._generation_prompt(tools)
        at = with_prompt.rfind(_SENTINEL)
        if at < 0 or last.rfind(_SENTINEL) < 0:
            raise TemplateProbeError("the chat template does not render the assistant's content")
        mid = with_prompt[at + len(_SENTINEL):]
        if prompt and mid.endswith(prompt):
            mid = mid[: len(mid) - len(prompt)]
        final = last[last.rfind(_SENTINEL) + len(_SENTINEL):]
        if answered:  # the sample's markup starts after its own JSON, not the probe's
            mid_end, final_end = mid.lstrip(_JSON_CLOSERS), final.lstrip(_JSON_CLOSERS)
        else:
            mid_end, final_end = mid, final
        plain_endings = [] if not answered else self._probe([{"role": "user", "content": "x"}], tools)[2]
        endings = [Ending.of(text, self._encode, self._decode_all) for text in (mid_end, final_end) if text]
        endings += plain_endings
        if len(self._probes) > 256:
            self._probes.clear()
        self._probes[key] = (probe, mid, endings)
        return self._probes[key]

    def _generation_prompt(self, tools: Sequence[dict] | None) -> str:
        """The text ``add_generation_prompt`` appends after a user turn."""
        bare = self.render_text([dict(_PROBE_USER)], tools)
        prompted = self.render_text([dict(_PROBE_USER)], tools, add_generation_prompt=True)
        return prompted[len(bare):] if prompted.startswith(bare) else ""

    def _close_turn(self, token_ids: Sequence[int], endings: list[Ending]) -> list[int]:
        """The part of the end-of-turn markup that the sampled tokens did not already produce, decided on
        decoded text (:mod:`forge_env.chat_endings`). No part produced: the turn was cut short, close it."""
        missing, cut = missing_ending(token_ids, endings, self._decode_all, self._control_token_ids())
        if cut:
            self.stats["closed_turns"] += 1
        return missing

    # ----------------------------------------------------------------- drift on the real conversation

    def check_drift(self, token_ids: Sequence[int], messages: Sequence[Message],
                    tools: Sequence[dict] | None = None) -> TemplateDrift | None:
        """Compare an episode's tokens (ending with a generation prompt) with the template's render of its
        ``messages``; ``None`` when token-exact, else the first divergence (warned once, counted)."""
        if not self.drift_checks:
            return None
        self.stats["drift_checks"] += 1
        conversation = self._conversation(messages)
        rendered = self.render(conversation, tools, add_generation_prompt=True)
        reasoning = [m["reasoning_content"] for m in conversation if m.get("reasoning_content")]
        controls = self._control_texts()
        drift = find_drift(token_ids, rendered, self._decode_all, reasoning, self._canonical, controls)
        if drift is None:
            if list(token_ids) != rendered:  # same text, other ids: what a server re-render would feed differs
                self.stats["retokenized"] += 1
            return None
        cut, kept = cut_control_tokens(list(token_ids), rendered, self._control_token_ids(), self._decode_all,
                                       self._canonical)
        if cut is not None:
            rest = find_drift(cut, rendered, self._decode_all, reasoning, self._canonical, controls)
            if rest is None:  # dropping the sampled control tokens is the whole difference
                drift.kind = CONTROL_TOKEN
                self.stats["control_tokens"] += 1
                return drift  # the sample's doing, not the template's: recorded, not warned about
            # The template's own drift lies past the control tokens: report it where the episode holds it.
            rest.token_index = kept[rest.token_index] if rest.token_index < len(kept) else len(token_ids)
            drift = rest
        if drift.kind == REASONING_DROPPED:
            self.stats["reasoning_dropped"] += 1
            return drift  # handled by the declared reasoning mode (kept, or re-rendered by the rollout)
        self.stats["non_prefix_preserving"] += 1
        if self.strict:
            raise NonPrefixPreservingTemplateError(drift.describe() + "; pass strict=False to record it instead")
        if not self._warned:
            self._warned = True
            warnings.warn(drift.describe() + " (recorded in the trajectory's drift list)",
                          NonPrefixPreservingTemplateWarning, stacklevel=2)
        return drift

    def rerender(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
        """The next prompt as the template renders the whole conversation (``reasoning="rerender"``)."""
        return self.render(self._conversation(messages), tools, add_generation_prompt=True)

    def _conversation(self, messages: Sequence[Message]) -> list[Message]:
        """The messages a server would hold; sampled call markup stays as text where the template drops calls."""
        split = structured(messages, self._parse, self._render_alone)
        if self.support.calls:
            return split
        return [m if s.get("tool_calls") and not m.get("tool_calls") else s
                for m, s in zip(messages, split, strict=True)]

    def _render_alone(self, messages: list[Message]) -> str:
        """The template's text for a few messages on their own (cached: called per assistant turn per check)."""
        key = repr(messages)
        if key not in self._alone:
            if len(self._alone) > 1024:
                self._alone.clear()
            try:
                self._alone[key] = self.render_text(messages)
            except Exception:  # a template may refuse a lone message (e.g. one that must follow a user turn)
                self._alone[key] = ""
        return self._alone[key]

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """End-of-turn tokens of this template that a sampler must stop at: the single-token markers among
        ``<|im_end|>``, ``<|eot_id|>``, ``<|eom_id|>``, ``<|call|>``, ``<|return|>``, ``</s>`` and
        DeepSeek's end of sentence that the template renders (gpt-oss ends a call turn with ``<|call|>``,
        which its tokenizer's ``eos_token`` does not name)."""
        return template_stop_ids(self.chat_template or getattr(self.tokenizer, "chat_template", "") or "",
                                 self._encode)

    # ----------------------------------------------------------------- the assistant's side

    def decode_assistant(self, sampled_ids: Sequence[int]) -> str:
        """The text of a sampled assistant turn: control tokens (end of turn, padding) dropped, tool-call and
        reasoning markup kept even where the tokenizer marks it special (``[TOOL_CALLS]``, ``<|channel|>``)."""
        return assistant_text(self.tokenizer, sampled_ids, self._control_token_ids())

    def _control_token_ids(self) -> set[int]:
        if self._control_ids is None:
            self._control_ids = control_token_ids(self.tokenizer)
        return self._control_ids

    def _control_texts(self) -> list[str]:
        if self._control_texts_cache is None:
            ids = sorted(self._control_token_ids())
            self._control_texts_cache = [t for t in self.tokenizer.convert_ids_to_tokens(ids) if t]
        return self._control_texts_cache

    def _decode_all(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _canonical(self, text: str) -> str:
        """``text`` as the tokenizer reads it: encoded (through its normaliser, e.g. Qwen's NFC) and decoded."""
        return self._decode_all(self._encode(text))

    def parse(self, text: str) -> ParsedAction:
        """Split assistant text into reasoning, content, tool calls and parse errors with the model's parser."""
        return self._parse(text)

    def parse_assistant(self, text: str) -> Message:
        """The assistant ``Message`` for ``text``: content, the well-formed tool calls, and any reasoning."""
        parsed = self.parse(text)
        message: Message = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = parsed.tool_calls
        return message

    def _encode(self, text: str) -> list[int]:
        tokenizer = self.tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        # The Rust tokenizer itself when the wrapper would change nothing (no truncation, padding or special-token
        # splitting set): the same ids without the wrapper's cost and encode_batch's thread-pool hop (~0.1 ms).
        if backend is not None and backend.truncation is None and backend.padding is None and \
                backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False)):
            return backend.encode(text, add_special_tokens=False).ids
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
