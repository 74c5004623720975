"""Answer extraction and grading on many answer formats (in-process, no worker pool)."""

from __future__ import annotations

import pytest

from environments.math.answers import extract_answer, last_boxed, normalize_answer, reference_answer
from environments.math.grading import grade

GSM8K_REFERENCE = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"

EQUIVALENT = [
    ("The answer is 72.", "72"),
    ("#### 72", GSM8K_REFERENCE),
    ("She sold 72 clips in all. The answer is 72", GSM8K_REFERENCE),
    ("$18", "18"),
    ("She pays 18 dollars.", "18"),
    ("The total is $1,000.", "1000"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{1{,}000}", "1000"),
    ("Answer: 1,234,567", "1234567"),
    ("\\boxed{\\$18.00}", "18"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("The answer is 0.5", "\\frac{1}{2}"),
    ("The answer is 3/4.", "0.75"),
    ("answer is 2.5 hours", "5/2"),
    ("\\boxed{50\\%}", "50"),
    ("The answer is 50%.", "0.5"),
    ("\\boxed{\\dfrac{2}{3}}", "2/3"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}"),
    ("we get $\\boxed{10\\sqrt{2}}$.", "\\sqrt{200}"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("Final answer: 3.50", "3.5"),
    ("\\boxed{\\text{Monday}}", "\\text{Monday}"),
    ("\\boxed{(1, 2)}", "(1,2)"),
    ("\\boxed{\\left(2, 3\\right)}", "(2,3)"),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}"),
    ("so x = \\boxed{5}", "5"),
    ("The answer is \u22125.", "-5"),
    ("She has 12 apples", "12"),
    ("\\boxed{90^\\circ}", "90"),
    ("#### 5\n", "The solution ... \\boxed{5}"),
    ("The answer is: 40 km/h", "40"),
]

DIFFERENT = [
    ("73", "72"),
    ("#### 71", GSM8K_REFERENCE),
    ("\\boxed{\\frac{1}{3}}", "0.5"),
    ("50%", "5"),
    ("The answer is 72. Wait, no: \\boxed{2}", "72"),
    ("1,001", "1000"),
    ("\\boxed{\\sqrt{2}}", "2"),
    ("\\boxed{x+1}", "x-1"),
    ("The answer is 0.51", "\\frac12"),
    ("\\boxed{(1,2)}", "(2,1)"),
]


@pytest.mark.parametrize(("reply", "reference"), EQUIVALENT)
def test_equivalent_answers_score_one(reply: str, reference: str) -> None:
    verdict = grade(reply, reference)
    assert verdict.correct, verdict
    assert verdict.status == "correct"


@pytest.mark.parametrize(("reply", "reference"), DIFFERENT)
def test_different_answers_score_zero(reply: str, reference: str) -> None:
    verdict = grade(reply, reference)
    assert not verdict.correct, verdict
    assert verdict.status == "wrong"


def test_last_boxed_handles_nested_and_escaped_braces() -> None:
    text = "first \\boxed{1} then \\boxed{\\frac{a}{\\sqrt{b}} + \\{x\\}} end"
    assert last_boxed(text) == "\\frac{a}{\\sqrt{b}} + \\{x\\}"
    assert last_boxed("\\boxed 7 apples") == "7"
    assert last_boxed("\\fbox{3}") == "3"
    assert last_boxed("\\boxed{unclosed {") is None
    assert last_boxed("nothing here") is None


def test_extraction_sources_and_format_marking() -> None:
    assert extract_answer("\\boxed{4}").source == "boxed"
    assert extract_answer("work...\n#### 4").source == "hash"
    assert extract_answer("So the final answer is 4.").source == "answer_is"
    guessed = extract_answer("2 + 2 makes 4")
    assert guessed.source == "last_number" and not guessed.marked and guessed.text == "4"
    assert extract_answer("I do not know") is None


def test_normalize_strips_units_currency_and_separators() -> None:
    assert normalize_answer("$1,000 dollars.") == "1000"
    assert normalize_answer("\\text{18 cm}") == "18"
    assert normalize_answer("25 percent") == "25%"
    assert normalize_answer("5x") == "5x"  # a variable is not a unit
    assert normalize_answer("2 + 3") == "2 + 3"
    assert normalize_answer("1,2") == "1,2"  # not a thousands separator: a pair


def test_reference_answer_formats() -> None:
    assert reference_answer(GSM8K_REFERENCE) == "72"
    assert reference_answer("so the area is \\boxed{\\frac{9}{2}}.") == "\\frac{9}{2}"
    assert reference_answer("  42 ") == "42"


def test_no_answer_and_caps_have_reasons() -> None:
    assert grade("I cannot solve this", "3").status == "no_answer"
    long = grade("\\boxed{" + "1+" * 600 + "1}", "1201", max_answer_chars=100)
    assert long.status == "too_long" and "max_answer_chars" in long.detail
    assert grade("\\boxed{3}", "").status == "error"
