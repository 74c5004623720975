"""Turn endings: which part of the template's end-of-turn markup a sampled assistant turn still lacks.

A sampled turn may stop before the template's end-of-turn markup (``max_tokens``, a stop string such as
``</tool_call>``), after all of it (``<|im_end|>``), or on a control token the template never renders
(``<|endoftext|>``). What is missing is decided on decoded text, never by matching the sampled ids against a
separate encoding of the markup: on a real BPE tokenizer the markup's first characters merge into the
sampled tokens before them (Qwen's ``'"}}\\n'`` holds the ``"\\n"`` that opens ``"\\n</tool_call>"``), and
a model may spell markup with other tokens than the template's encoding uses.

The rule: control tokens that are not part of any candidate ending are left out of the sampled text; the
longest prefix of a candidate ending that the text ends with, cut at one of the ending's own token
boundaries, is what the turn produced; the ending's remaining tokens (the template's own ids) are appended.
Cutting only at the ending's token boundaries keeps a sample that ended inside a control token's text
(``<|im_`` spelled with ordinary tokens) from being "completed" with the rest of that text.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

#: Tokens of slack when decoding the end of a sample (a token may start inside a multi-byte character).
_SLACK = 2


@dataclass(frozen=True)
class Ending:
    """One candidate end-of-turn markup: its token ids, their decoded text, and the character offset of every
    token boundary in that text (``bounds[j]`` is where token ``j`` starts, the last entry is the length; -1
    where the boundary falls inside a character, as between the bytes of a byte-level ``｜``)."""

    ids: tuple[int, ...]
    text: str
    bounds: tuple[int, ...]

    @classmethod
    def of(cls, text: str, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]) -> Ending:
        ids = tuple(encode(text))
        full = decode(list(ids))
        prefixes = (decode(list(ids[:j])) for j in range(len(ids) + 1))
        bounds = tuple(len(p) if full.startswith(p) else -1 for p in prefixes)
        return cls(ids=ids, text=full, bounds=bounds)


def missing_ending(token_ids: Sequence[int], endings: Sequence[Ending], decode: Callable[[list[int]], str],
                   control_ids: Collection[int]) -> tuple[list[int], bool]:
    """The ids that close the sampled turn at the end of ``token_ids``, and whether it produced none of its
    ending (it was cut short).

    ``endings`` are the candidates, most likely first (a tie goes to the earlier one); ``control_ids`` are the
    tokenizer's control tokens (end of text, padding…), left out of the sampled text unless an ending holds
    them.
    """
    endings = [e for e in endings if e.ids]
    if not endings:
        return [], False
    kept_controls = {i for e in endings for i in e.ids}
    window = max(len(e.text.encode("utf-8")) for e in endings) + _SLACK
    tail: list[int] = []
    for token in reversed(token_ids[-4 * window:]):
        if token in control_ids and token not in kept_controls:
            continue  # e.g. a sample that stopped on <|endoftext|>: not part of the markup, not a reason to redo it
        tail.append(token)
        if len(tail) == window:
            break
    text = decode(tail[::-1])
    produced, best, best_tokens = 0, endings[0], 0
    for ending in endings:
        for tokens in range(len(ending.ids), 0, -1):
            chars = ending.bounds[tokens]
            if chars < 0:
                continue
            if chars <= produced:
                break
            if text.endswith(ending.text[:chars]):
                produced, best, best_tokens = chars, ending, tokens
                break
    return list(best.ids[best_tokens:]), produced == 0


def template_stop_ids(template: str, encode: Callable[[str], list[int]]) -> tuple[int, ...]:
    """The single-token end-of-turn markers (``TURN_STOPS``) that ``template`` renders: what a sampler must stop at."""
    from forge_env.tools.formats import TURN_STOPS

    ids = []
    for marker in TURN_STOPS:
        if marker in template:
            encoded = encode(marker)
            if len(encoded) == 1:
                ids.append(encoded[0])
    return tuple(ids)


def control_token_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's special tokens that are no tool-call or reasoning markup (end of turn, padding…)."""
    from forge_env.tools.formats import MARKUP_TOKENS

    special = {tokenizer.convert_tokens_to_ids(t): t for t in getattr(tokenizer, "all_special_tokens", [])}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            special[token_id] = str(added)
    return {i for i, text in special.items() if text not in MARKUP_TOKENS}


def assistant_text(tokenizer: Any, sampled_ids: Sequence[int], control: Collection[int]) -> str:
    """A sampled turn's text: ``control`` tokens dropped, a trailing end-of-turn marker (``TURN_ENDS``) cut."""
    from forge_env.tools.formats import TURN_ENDS

    text = tokenizer.decode([i for i in sampled_ids if i not in control], skip_special_tokens=False)
    for end in TURN_ENDS:
        if text.endswith(end):
            return text[: -len(end)]
    return text
