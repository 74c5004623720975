"""The calculator tool: exact arithmetic by walking the syntax tree, a clear reason for everything else."""

import re
from fractions import Fraction

import pytest

from forge_env.tools.calculator import CalculatorError, calculate, calculator, evaluate, format_number


@pytest.mark.parametrize(
    "expression, value",
    [
        ("23+45*2", "113"), ("12 * (3 + 4)", "84"), ("-3-4", "-7"), ("--5", "5"), ("7/2", "3.5"), ("1/3", "0.333333"),
        ("0.1 + 0.2", "0.3"), ("2^10", "1024"), ("2**-1", "0.5"), ("10//3", "3"), ("-7 % 3", "2"), ("10%4", "2"),
        ("1,000+1", "1001"), ("48,210 - 41 =", "48169"), ("6×7÷2", "21"), ("5 − 2", "3"),
    ],
)
def test_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression, reason",
    [
        ("", "give an expression"),
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9**9**9", "exponents must be whole numbers up to 64"),
        ("2**0.5", "exponents must be whole numbers"),
        ("9" * 70 + "*" + "9" * 70, "the result is too large"),
        ("1e400", "too large"),
        ("1+" * 150 + "1", "longer than 200 characters"),
        ("1 +", "cannot parse"),
        ("1,2", "commas only separate thousands"),
        ("x + 1", "unknown name 'x': only numbers"),
        ("__import__('os').system('true')", "only numbers, parentheses"),
        ("(1).real", "only numbers"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("[1, 2]", "only numbers"),
        ("1 << 4", "operator LShift is not supported"),
    ],
)
def test_refuses_with_a_reason(expression, reason):
    with pytest.raises(CalculatorError, match=re.escape(reason)):
        evaluate(expression)


def test_format_number():
    assert format_number(Fraction(84)) == "84"
    assert format_number(Fraction(-7, 2)) == "-3.5"
    assert format_number(Fraction(2, 3)) == "0.666667"
    assert format_number(Fraction(-1, 3)) == "-0.333333"


async def test_calculator_tool_schema_and_errors():
    spec = calculator.spec["function"]
    assert spec["name"] == "calculator" and spec["parameters"]["required"] == ["expression"]
    assert await calculator(expression="6070 + 4324") == "10394"
    with pytest.raises(CalculatorError, match="division by zero"):
        await calculator(expression="1/0")


@pytest.mark.parametrize("expression", ["(((((1/10^60)^64)^64)^64)^64)", "((1/3)^64)^64", "(1/7^60)^64",
                                        "((2/3)^64)^64*0"])
def test_tiny_values_with_huge_denominators_are_refused_at_once(expression):
    with pytest.raises(CalculatorError, match="too (large|precise)"):
        evaluate(expression)


def test_a_denominator_bomb_cannot_hang_an_env_step():
    """In a child process, so that the unbounded computation of the past fails this test instead of hanging it."""
    import os
    import pathlib
    import subprocess
    import sys

    program = (
        "from forge_env import ToolEnv\n"
        "from forge_env.tools.calculator import calculator\n"
        "env = ToolEnv(tools=[calculator], tasks=[{'question': 'q', 'answer': '1'}], tool_timeout=5)\n"
        "env.reset(seed=0)\n"
        "call = '<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"(((((1/10^60)^64)^64)^64)^64)\"}}</tool_call>'\n"
        "observation, *_ = env.step(call)\n"
        "print(observation[0]['content'])\n"
    )
    root = str(pathlib.Path(__file__).resolve().parents[1])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          cwd=root, env=environment)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Error:") and "too" in done.stdout
