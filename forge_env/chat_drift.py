"""Template drift: where an episode's tokens differ from what the chat template renders for its messages.

An episode's token list grows turn by turn: the sampled tokens verbatim, then the env's reply rendered
incrementally. Many published templates re-render earlier turns once later messages arrive — Mistral-Nemo
moves the system prompt into the last user message, DeepSeek-R1 and Qwen3 drop earlier reasoning,
Hermes-3 renders a tool response differently once it is no longer last, gpt-oss ends an earlier final
answer in ``<|end|>`` where the model sampled ``<|return|>``. The tokens the policy saw are then not what
a server re-rendering the conversation (the way the model is served) would feed it.

No probe conversation can foresee every such rule, so the decision is made on the real conversation:
:func:`find_drift` renders the episode's messages with the template and compares the result with the
tokens the episode holds. Equal means token-exact; otherwise the first differing token is reported with
both sides quoted. A model's sampled text is first turned back into the structured message a server
would hold (:func:`structured`), so a reported drift is a real train/serve difference.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from forge_env.tools.parsers import ParsedAction
from forge_env.types import Message
from forge_env.types.trajectory import CONTROL_TOKEN, REASONING_DROPPED, RERENDERED  # noqa: F401  (drift kinds, re-exported)

#: Characters of context quoted on each side of a divergence.
_WINDOW = 48
#: Where the first differing token and the first differing character are further apart than this, the
#: report moves to the token holding the character (the tokens before it only tokenize the same text apart).
_RESYNC = 16

#: At most this many sampled control tokens are cut to explain one drift (each cut re-decodes the episode).
_MAX_CONTROL_CUTS = 256
#: Control tokens this many tokens apart or closer are cut together when one alone moves nothing (a sampled
#: character's UTF-8 bytes may have several between them).
_CONTROL_GAP = 4
#: Tokens on each side within which a sampled control token's neighbours must spell the same text again.
_RESYNC_SPAN = 6


@dataclass
class TemplateDrift:
    """The first token at which an episode's tokens and the template's render of its messages differ."""

    token_index: int
    kind: str
    held: str
    rendered: str

    def describe(self) -> str:
        what = {REASONING_DROPPED: "drops reasoning the episode kept",
                CONTROL_TOKEN: "cannot hold a control token sampled inside a turn"}.get(self.kind,
                                                                                     "re-renders earlier turns")
        return (f"the chat template {what}: from token {self.token_index} the episode holds {self.held!r} "
                f"but a full re-render gives {self.rendered!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def structured(messages: Sequence[Message], parse: Callable[[str], ParsedAction],
               render: Callable[[list[Message]], str] | None = None) -> list[Message]:
    """The messages as a chat server would hold them: raw assistant text split into reasoning, content and
    tool calls (arguments as objects, the form templates render with ``tojson``).

    Parsers strip the content's surrounding whitespace; whether the template expects it stripped (Qwen3
    writes ``content\n<tool_call>`` itself) or kept (``content <tool_call>``) is the template's business, so
    with ``render`` (a conversation -> text function) the form whose rendering contains the sampled text wins.
    """
    result: list[Message] = []
    for message in messages:
        if message.get("role") != "assistant":
            result.append(message)
            continue
        message = dict(message)  # type: ignore[assignment]
        if "tool_calls" not in message and "reasoning_content" not in message:
            raw = message.get("content") or ""
            parsed = parse(raw)
            # Plain text stays as sampled (a server keeps it whole), and so does a turn with a malformed call
            # (no structured form holds it); markup (calls, reasoning, channels) is split.
            if not parsed.errors and (parsed.tool_calls or parsed.reasoning is not None
                                      or parsed.content != raw.strip()):
                message = _split(message, parsed, parsed.content)
                if render is not None and parsed.raw_content not in (None, parsed.content):
                    kept = _split(message, parsed, parsed.raw_content)
                    if raw not in render([message]) and raw in render([kept]):
                        message = kept
        if message.get("reasoning_content") is not None:
            message["thinking"] = message["reasoning_content"]  # gpt-oss templates read ``thinking``
        if message.get("tool_calls"):
            message["tool_calls"] = [_with_object_arguments(call) for call in message["tool_calls"]]
        result.append(message)  # type: ignore[arg-type]
    return result


def _split(message: Message, parsed: ParsedAction, content: str | None) -> Message:
    split: Message = {**message, "content": content or ""}  # type: ignore[typeddict-item]
    if parsed.reasoning is not None:
        split["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        split["tool_calls"] = [_with_object_arguments(call) for call in parsed.tool_calls]
    return split


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function", {}))
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    return {**call, "function": function}


def with_text_arguments(messages: Sequence[Message]) -> list[Message]:
    """The messages with every tool call's object arguments as JSON text (as ``tojson`` writes it)."""
    result: list[Message] = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls and any(not isinstance(c.get("function", {}).get("arguments", ""), str) for c in calls):
            message = {**message, "tool_calls": [_with_text_arguments(c) for c in calls]}  # type: ignore[typeddict-item]
        result.append(message)
    return result


def _with_text_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function", {}))
    if not isinstance(function.get("arguments", ""), str):
        function["arguments"] = json.dumps(function["arguments"], ensure_ascii=False)
    return {**call, "function": function}


def first_difference(held: list[int], rendered: list[int], decode: Callable[[list[int]], str],
                     canonical: Callable[[str], str] | None = None) -> tuple[int, int, str, str] | None:
    """``(first differing token, first differing character, held text, rendered text)``, or ``None`` when the
    two token lists are equal or decode to the same text (the held side read through ``canonical``)."""
    if held == rendered:
        return None
    index = next((i for i, (a, b) in enumerate(zip(held, rendered, strict=False)) if a != b),
                 min(len(held), len(rendered)))
    held_all, rendered_all = decode(held), decode(rendered)
    if held_all != rendered_all and canonical is not None:
        held_all = canonical(held_all)
    if held_all == rendered_all:
        return None  # same text, other tokens: sampled text that re-tokenizes differently, not the template
    char = next((k for k, (a, b) in enumerate(zip(held_all, rendered_all, strict=False)) if a != b),
                min(len(held_all), len(rendered_all)))
    return index, char, held_all, rendered_all


def token_holding(ids: list[int], char: int, decode: Callable[[list[int]], str], lo: int = 0) -> int:
    """The first token (from ``lo``) whose text reaches past character ``char`` of ``decode(ids)``."""
    hi = len(ids)
    while lo < hi:
        middle = (lo + hi) // 2
        if len(decode(ids[:middle + 1])) > char:
            hi = middle
        else:
            lo = middle + 1
    return lo


def find_drift(held: Sequence[int], rendered: Sequence[int], decode: Callable[[list[int]], str],
               reasoning: Sequence[str] = (), canonical: Callable[[str], str] | None = None,
               control_texts: Sequence[str] = ()) -> TemplateDrift | None:
    """Compare the episode's tokens with the template's; ``None`` when they are equal or hold the same text.

    ``reasoning`` lists the episode's reasoning texts: a divergence where the held side still contains one
    of them and the rendered side does not is classed as dropped reasoning. ``canonical`` maps decoded text
    to the text the tokenizer reads back (encode, then decode: its normaliser applied, e.g. Qwen's NFC), so a
    sampled token whose text the normaliser rewrites is not mistaken for template drift; the rendered side is
    already in that form. ``control_texts`` (the control tokens' texts) are left out of both sides when the kind
    is decided: a model may sample them inside the reasoning a template drops.
    """
    held, rendered = list(held), list(rendered)
    found = first_difference(held, rendered, decode, canonical)
    if found is None:
        return None
    index, char, held_all, rendered_all = found
    start = len(decode(held[:index]))
    if char - start >= _RESYNC:  # tokens differ early but the text only later: report the token holding it
        index = token_holding(held, char, decode, index)
        start = len(decode(held[:index]))
    start = min(start, char)
    held_rest, rendered_rest = held_all[start:], rendered_all[start:]
    held_text, rendered_text = held_rest[:4 * _WINDOW], rendered_rest[:4 * _WINDOW]
    for control in control_texts:
        held_rest, rendered_rest = held_rest.replace(control, ""), rendered_rest.replace(control, "")
    held_plain, rendered_plain = held_rest[:4 * _WINDOW], rendered_rest[:4 * _WINDOW]
    kind = RERENDERED
    if held_plain.count("</think>") > rendered_plain.count("</think>"):  # a think block (maybe empty) is gone
        kind = REASONING_DROPPED
    for text in reasoning:
        probe = text.strip()[:_WINDOW]
        if probe and probe in held_plain and probe not in rendered_plain:
            kind = REASONING_DROPPED
            break
    return TemplateDrift(token_index=index, kind=kind, held=held_text[:_WINDOW], rendered=rendered_text[:_WINDOW])


def cut_control_tokens(held: list[int], rendered: list[int], control: set[int], decode: Callable[[list[int]], str],
                       canonical: Callable[[str], str] | None = None) -> tuple[list[int] | None, list[int]]:
    """``held`` without the ``control`` tokens sampled inside turns, with the positions it keeps; ``(None, ...)``
    when none was cut.

    Those between tokens both sides share are found in one linear walk (:func:`_aligned_cuts`). Then, at each
    first difference left, the first control token from the one holding the first differing character is
    cut when that moves the first differing character on: the token is what the re-render lacks. It may sit
    a little after the first differing token (bytes of an incomplete UTF-8 sequence sampled just before it
    decode to U+FFFD and join the bytes after it once it is gone; a BPE vocabulary re-tokenizes the joined
    text). When it alone moves nothing, the control tokens close after it are cut with it, one more at a
    time: a run (``<|pad|><|endoftext|>``), or one character's bytes sampled around several. A model may
    sample them in several places and turns: each first difference is taken in turn. A cut that moves
    nothing ends it (what differs there is the template's), so the template's own control tokens
    (``<|im_end|>``) are not cut where the re-render holds them.
    """
    kept = list(range(len(held)))
    aligned = set(_aligned_cuts(held, rendered, control, decode))
    if aligned:  # most sampled control tokens sit between tokens both sides share: cut those in one pass
        held = [t for k, t in enumerate(held) if k not in aligned]
        kept = [k for k in kept if k not in aligned]
    found = first_difference(held, rendered, decode, canonical)
    cuts = 0
    while found is not None and cuts < _MAX_CONTROL_CUTS:
        index, char = found[0], found[1]
        # Tokens may differ well before the text does (sampled bytes the re-render spells as U+FFFD).
        first = token_holding(held, char, decode, index)
        chain: list[int] = []  # control tokens from there, each within a few tokens of the one before
        for k in range(first, len(held)):
            if k - (chain[-1] if chain else first) > _CONTROL_GAP or len(chain) == _MAX_CONTROL_CUTS:
                break
            if held[k] in control:
                chain.append(k)
        for m in range(1, len(chain) + 1):  # as few of them as moves the difference on
            cut = set(chain[:m])
            trial = [t for k, t in enumerate(held) if k not in cut]
            after = first_difference(trial, rendered, decode, canonical)
            if after is None or after[1] > char:
                break
        else:
            break  # cutting them moves nothing: the difference there is the template's
        held, found, cuts = trial, after, cuts + m
        kept = [k for j, k in enumerate(kept) if j not in cut]
    return (held if cuts or aligned else None), kept


def _aligned_cuts(held: list[int], rendered: list[int], control: set[int],
                  decode: Callable[[list[int]], str]) -> list[int]:
    """Positions of ``held``'s control tokens that a token-by-token walk of both lists finds where ``rendered`` has
    none: each is cut only where the tokens after it (a few held tokens, its control tokens dropped, against a few
    rendered ones) spell the same text and are followed by the same token, or by the end of both lists. The walk
    stops at the first place where no such short stretch exists (the template's difference, or one the text-level
    cuts of :func:`cut_control_tokens` have to find). Linear in the episode's length, not quadratic in its control
    tokens; what it cuts is checked by the caller on the whole decoded text like any other cut."""
    cuts: list[int] = []
    i = j = 0
    n, m = len(held), len(rendered)
    while i < n:
        if j < m and held[i] == rendered[j]:
            i, j = i + 1, j + 1
            continue
        if held[i] in control:  # a run of them, up to the next token that matches
            k = i
            while k < n and held[k] in control and not (j < m and held[k] == rendered[j]):
                k += 1
            if k == n and j == m or k < n and j < m and held[k] == rendered[j]:
                cuts += range(i, k)
                i = k
                continue
        step = _resync(held, rendered, i, j, control, decode)
        if step is None:
            break
        k, length, cut = step
        cuts += cut
        i, j = i + k, j + length
    return cuts


def _resync(held: list[int], rendered: list[int], i: int, j: int, control: set[int],
            decode: Callable[[list[int]], str]) -> tuple[int, int, list[int]] | None:
    """The shortest stretches ``held[i:i+k]``, ``rendered[j:j+l]`` that spell the same text (no U+FFFD) once the
    control tokens in the held one are dropped, and after which both lists go on with the same token (or both end):
    ``(k, l, positions of the control tokens cut)``. Sampled text re-tokenized, with or without control tokens in it."""
    n, m = len(held), len(rendered)
    for total in range(2, 2 * _RESYNC_SPAN + 1):
        for k in range(max(1, total - _RESYNC_SPAN), min(total, _RESYNC_SPAN + 1)):
            length = total - k
            if i + k > n or j + length > m:
                continue
            if not (i + k == n and j + length == m or i + k < n and j + length < m
                    and held[i + k] == rendered[j + length]):
                continue
            cut = [p for p in range(i, i + k) if held[p] in control]
            text = decode([t for t in held[i:i + k] if t not in control])
            if "\ufffd" not in text and text == decode(rendered[j:j + length]):
                return k, length, cut
    return None
