"""The calculator tool: safe arithmetic by walking the syntax tree, clear errors for everything else."""

import re

import pytest

from forge_env.tools.calculator import CalculatorError, calculator, evaluate, format_number


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("12 * (3 + 4)", 84),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("2 ** 10", 1024),
        ("2^10", 1024),
        ("3 × 4 ÷ 2", 6),
        ("48210 - 41 =", 48169),
        ("abs(-5) + max(1, 9, 3) + min(4, 2)", 16),
        ("round(2.567, 2)", 2.57),
        ("sqrt(81)", 9),
        ("--5", 5),
    ],
)
def test_evaluates_arithmetic(expression, expected):
    assert evaluate(expression) == expected


@pytest.mark.parametrize(
    "expression, message",
    [
        ("", "empty"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("48,210 - 41", "commas are not allowed"),
        ("x + 1", "unknown name 'x'"),
        ("__import__('os').system('true')", "unsupported syntax"),
        ("(1).real", "unsupported syntax"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("9 ** 9 ** 9", "exponent 387420489 is too large"),
        ("10 ** 300 * 10", "too large"),
        ("1e400", "not a finite number"),
        ("sqrt(-1)", "sqrt(): math domain error"),
        ("round(2.5, ndigits=1)", "takes no keyword arguments"),
        ("1 +", "cannot parse"),
        ("1" * 501, "the limit is 500"),
        ("[1, 2]", "unsupported syntax"),
    ],
)
def test_refuses_with_a_clear_error(expression, message):
    with pytest.raises(CalculatorError, match=re.escape(message)):
        evaluate(expression)


def test_format_number():
    assert format_number(84) == "84"
    assert format_number(6.0) == "6"
    assert format_number(0.1 + 0.2) == "0.3"
    assert format_number(1 / 3) == "0.333333333333"


async def test_calculator_tool_schema_and_errors():
    assert calculator.spec["function"]["name"] == "calculator"
    assert calculator.spec["function"]["parameters"]["required"] == ["expression"]
    assert await calculator(expression="6070 + 4324") == "10394"
    with pytest.raises(CalculatorError, match="division by zero"):
        await calculator(expression="1/0")
