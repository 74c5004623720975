"""Finding the final answer in a model's reply or a dataset's reference solution.

Pure string work (standard library only, linear-time scans) so it is cheap and safe
to run anywhere. It recognises, in order of precedence:

- ``\\boxed{...}`` / ``\\fbox{...}`` with nested braces (the last one wins),
- GSM8K's ``#### 18`` marker,
- "The answer is 18" / "Final answer: 18",
- otherwise the last number in the text (marked as unformatted).

``normalize_answer`` then strips what is not part of the value: currency signs,
units such as "18 dollars", thousands separators, ``\\text{}``, ``\\!`` and a trailing
full stop. Equivalence of the normalised strings (``\\frac{1}{2}`` vs ``0.5``, ``50%``)
is decided by the grader (``environments.math.grading``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

AnswerSource = Literal["boxed", "hash", "answer_is", "last_number"]

# Sources where the model marked its answer explicitly (as opposed to our guess of the last number).
MARKED_SOURCES: frozenset[str] = frozenset({"boxed", "hash", "answer_is"})

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS_RE = re.compile(
    r"(?:final answer|the answer|answer)(?:[ \t]+is)?[ \t]*(?::|is|=)[ \t]*([^\n]*)",
    re.IGNORECASE,
)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_LATEX_THOUSANDS_RE = re.compile(r"(\d)\{,\}(\d)")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|textrm)\{([^{}]*)\}")
_LEADING_NUMBER_RE = re.compile(r"^(-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:/\d+)?)\s*(%|\\%|percent)?\s*(.*)$", re.IGNORECASE)
_PLAIN_NUMBER_RE = re.compile(r"^(-?)(\d+(?:\.\d*)?|\.\d+)(?:/(\d+))?(%?)$")


@dataclass(frozen=True)
class ExtractedAnswer:
    """An answer found in a text: the raw span, its normalised form and how it was found."""

    raw: str
    text: str
    source: AnswerSource

    @property
    def marked(self) -> bool:
        """True when the writer marked the answer (boxed, ``####``, "the answer is") rather than us guessing."""
        return self.source in MARKED_SOURCES


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, nested braces included.

    Also accepts the brace-less ``\\boxed 5`` form. Returns None when there is none or
    the last one is never closed.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if i < len(text) and text[i] == " ":
        match = re.match(r" +([^\s$]+)", text[i:])
        return match.group(1) if match else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        ch = text[j]
        if ch == "\\" and j + 1 < len(text) and text[j + 1] in "{}":
            continue
        if ch == "{" and not (j > 0 and text[j - 1] == "\\"):
            depth += 1
        elif ch == "}" and not (j > 0 and text[j - 1] == "\\"):
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _sentence_head(span: str) -> str:
    """The start of ``span`` up to the end of its sentence (a full stop followed by a space or the end)."""
    span = span.strip()
    # A '.' ends the sentence unless it sits between digits (a decimal point).
    match = re.search(r"\.(?!\d)", span)
    if match:
        span = span[: match.start()]
    return span.strip()


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - we want the final match
        pass
    return last


def extract_answer(text: str) -> ExtractedAnswer | None:
    """The final answer in a model reply, or None when the text holds no candidate at all."""
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return ExtractedAnswer(boxed, normalize_answer(boxed), "boxed")
    hashed = _last_match(_HASH_RE, text)
    if hashed and hashed.group(1).strip():
        raw = hashed.group(1).strip()
        return ExtractedAnswer(raw, normalize_answer(raw), "hash")
    stated = _last_match(_ANSWER_IS_RE, text)
    if stated:
        raw = _sentence_head(stated.group(1))
        if raw:
            return ExtractedAnswer(raw, normalize_answer(raw), "answer_is")
    number = _last_match(_NUMBER_RE, text)
    if number:
        raw = number.group(0)
        return ExtractedAnswer(raw, normalize_answer(raw), "last_number")
    return None


def reference_answer(reference: str) -> str:
    """The normalised answer in a dataset reference: GSM8K's ``... #### 18``, a MATH solution's last
    ``\\boxed{}``, or the reference itself when it is already a bare answer."""
    hashed = _last_match(_HASH_RE, reference)
    if hashed and hashed.group(1).strip():
        return normalize_answer(hashed.group(1))
    boxed = last_boxed(reference)
    if boxed is not None and boxed.strip():
        return normalize_answer(boxed)
    return normalize_answer(reference)


def normalize_answer(answer: str) -> str:
    """Strip what is not part of the value: ``$``, ``\\$``, units after a number, thousands separators,
    ``\\text{}`` wrappers, ``\\!`` spacing, ``\\left``/``\\right`` and a trailing full stop.

    >>> normalize_answer("$1,000 dollars.")
    '1000'
    >>> normalize_answer("\\\\frac{1}{2}")
    '\\\\frac{1}{2}'
    """
    s = answer.strip().replace("\u2212", "-")
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = _LATEX_THOUSANDS_RE.sub(r"\1\2", s)
    s = _TEXT_CMD_RE.sub(r" \1 ", s).strip()
    s = s.rstrip(".").strip()
    if s.startswith("="):
        s = s[1:].strip()
    number = _LEADING_NUMBER_RE.match(s)
    if number:
        value, percent, rest = number.groups()
        # "18 dollars", "3 apples", "40 km/h": a number followed by words is the number.
        # A number followed by maths ("2 + 3", "2\\sqrt{3}", "5x") is left alone.
        is_unit = re.fullmatch(r"[A-Za-z][A-Za-z /.\-]*", rest) is not None and not re.fullmatch(r"[a-z]", rest)
        if not rest or is_unit:
            if _THOUSANDS_RE.match(value.split("/")[0]):
                value = value.replace(",", "")
            return value + ("%" if percent else "")
    return s


def plain_number(text: str) -> tuple[Fraction, bool] | None:
    """Parse an integer, decimal or ``a/b`` (optionally with ``%``) exactly; None for anything else.

    Returns the value and whether it carried a percent sign.
    """
    match = _PLAIN_NUMBER_RE.match(text.replace(" ", ""))
    if not match:
        return None
    sign, number, denominator, percent = match.groups()
    value = Fraction(number)
    if denominator is not None:
        if int(denominator) == 0:
            return None
        value /= int(denominator)
    return (-value if sign else value), bool(percent)
