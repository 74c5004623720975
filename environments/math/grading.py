"""Deciding whether a model's answer equals the reference answer.

``grade`` extracts the final answer (``environments.math.answers``), settles plain
numbers exactly with ``fractions.Fraction`` (the common GSM8K case, no sympy), and
hands everything else (``\\frac{1}{2}`` vs ``0.5``, ``\\sqrt{3}/2``, sets, intervals,
percentages) to ``math-verify``, which compares with sympy.

Sympy can run for ever on hostile input (``2^{2^{40}}``), so ``grade`` is meant to run
inside a ``VerifierPool`` worker process that is killed at a deadline; called in-process
it relies on math-verify's own ``signal.alarm`` timeouts, which only work on the main
thread, so leave ``inner_timeout_s`` as None anywhere else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from environments.math.answers import extract_answer, plain_number, reference_answer
from forge_env.core import verdict as verdicts

VerdictStatus = Literal["correct", "wrong", "no_answer", "too_long", "timeout", "worker_crashed", "error"]

DEFAULT_MAX_ANSWER_CHARS = 1_000


@dataclass(init=False)
class AnswerVerdict(verdicts.Verdict):
    """Math-v0's :class:`~forge_env.core.verdict.Verdict`: whether the answer equals the reference (``passed``,
    also ``correct``; ``reward`` 1.0 or 0.0), and the answers compared.

    ``status`` says why: ``correct``/``wrong`` (compared), ``no_answer`` (nothing found in the
    reply), ``too_long`` (input over a size cap), ``timeout`` (the check ran past its deadline
    and its worker was killed), ``worker_crashed`` or ``error`` (``detail`` has the message).
    ``source`` is where the answer was found (``boxed``, ``####``, ``last_number``, ...); ``marked`` is True
    when the reply marked its answer (``\\boxed{}``, ``####``, "the answer is").
    Built as ``AnswerVerdict(correct, status, predicted=..., reference=..., source=..., marked=..., detail=...)``;
    it crosses the verifier worker's pipe as :meth:`to_dict`.
    """

    predicted: str | None = None
    reference: str | None = None
    source: str | None = None
    marked: bool = False

    def __init__(self, correct: bool, status: VerdictStatus, predicted: str | None = None,
                 reference: str | None = None, source: str | None = None, marked: bool = False,
                 detail: str = "") -> None:
        super().__init__(reward=float(bool(correct)), passed=bool(correct), status=status, detail=detail)
        self.predicted = predicted
        self.reference = reference
        self.source = source
        self.marked = marked

    @property
    def correct(self) -> bool:
        return self.passed

    def to_dict(self) -> dict[str, Any]:
        return {"correct": self.passed, "status": self.status, "predicted": self.predicted,
                "reference": self.reference, "source": self.source, "marked": self.marked, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AnswerVerdict:
        return cls(**data)


#: The old name, kept for imports (``environments.math.verify`` and user code say ``Verdict``).
Verdict = AnswerVerdict


def _numbers_equal(predicted: str, reference: str) -> bool | None:
    """Exact comparison when both sides are plain numbers; None when sympy has to decide.

    A percentage on either side also matches its fraction (``50%`` equals ``50`` and ``0.5``),
    which is what math-verify does too.
    """
    pred = plain_number(predicted)
    ref = plain_number(reference)
    if pred is None or ref is None:
        return None
    (p, p_pct), (r, r_pct) = pred, ref
    if p == r or (p_pct and p / 100 == r) or (r_pct and r / 100 == p):
        return True
    if p.denominator == 1 and r.denominator == 1:
        return False
    return None  # decimals may differ only by rounding; math-verify rounds floats


def _sympy_equal(predicted: str, reference: str, inner_timeout_s: int | None) -> bool:
    # math_verify is imported here so importing this module (and the env) stays fast.
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once when timeouts are off
    gold = parse(f"${reference}$", parsing_timeout=inner_timeout_s)
    pred = parse(f"${predicted}$", parsing_timeout=inner_timeout_s)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=inner_timeout_s))


def _compact(text: str) -> str:
    return "".join(text.split()).lower()


def grade(
    prediction: str,
    reference: str,
    *,
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    inner_timeout_s: int | None = None,
) -> AnswerVerdict:
    """Grade a model reply against a reference (a bare answer, GSM8K ``... #### 18`` or a boxed solution)."""
    ref = reference_answer(reference)
    if not ref:
        return AnswerVerdict(False, "error", reference=ref, detail="the reference has no answer in it")
    found = extract_answer(prediction)
    if found is None:
        return AnswerVerdict(False, "no_answer", reference=ref, detail="no answer found in the reply")
    common = {"predicted": found.text, "reference": ref, "source": found.source, "marked": found.marked}
    if len(found.text) > max_answer_chars or len(ref) > max_answer_chars:
        detail = (
            f"answer of {len(found.text)} chars / reference of {len(ref)} chars: over the cap of "
            f"{max_answer_chars} chars (max_answer_chars), not compared"
        )
        return AnswerVerdict(False, "too_long", detail=detail, **common)
    equal = _numbers_equal(found.text, ref)
    if equal is None:
        equal = _compact(found.text) == _compact(ref) or _sympy_equal(found.text, ref, inner_timeout_s)
    return AnswerVerdict(equal, "correct" if equal else "wrong", **common)


def grade_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """Worker entry: ``{"prediction", "reference", "max_answer_chars"}`` -> a Verdict as a dict."""
    verdict = grade(
        payload["prediction"],
        payload["reference"],
        max_answer_chars=payload.get("max_answer_chars", DEFAULT_MAX_ANSWER_CHARS),
    )
    return verdict.to_dict()
