"""A safe calculator and the ``calculator`` tool built on it (shared by the math and tool-use environments).

Expressions are parsed with :mod:`ast` and evaluated exactly with :class:`fractions.Fraction`
by walking the tree: numbers, parentheses, unary signs and ``+ - * / // % **`` (``^`` means
power; ``×``, ``÷``, ``−`` and thousands separators such as ``48,210`` are accepted; a
trailing ``=`` is ignored). Nothing is ever passed to ``eval``; anything else is refused
with a :class:`CalculatorError` saying why, and sizes are bounded (expression length,
exponent, magnitude and precision of every intermediate value: numerator and denominator
are both limited, and a power is refused *before* it is computed if its result would be
too big) so a call can neither run code nor run for long. The tool evaluates in a worker
thread, so the event loop keeps running and the environment's tool timeout applies. Results print as integers when whole, else as decimals rounded to six places.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import re
from fractions import Fraction

from forge_env.tools.tool import ToolError, tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = Fraction(10) ** 60
#: Bits of an intermediate value's numerator or denominator (1/10**60 needs 200; 2048 leaves room).
MAX_BITS = 2048
DECIMAL_PLACES = 6

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_ALLOWED = "only numbers, parentheses and + - * / // % ^ are allowed"
_SPELLINGS = {"^": "**", "×": "*", "÷": "/", "−": "-"}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class CalculatorError(ToolError):
    """The expression is not something the calculator evaluates; the message says why."""


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if not math.isfinite(node.value):
            raise CalculatorError("the number is too large")
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise CalculatorError("division by zero")
            if max(_bits(left), 1) * abs(int(right)) > MAX_BITS:
                raise CalculatorError("the result is too large or too precise")
            result = left ** int(right)
        elif type(node.op) in _BINARY:
            if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
                raise CalculatorError("division by zero")
            result = _BINARY[type(node.op)](left, right)
        else:
            raise CalculatorError(f"operator {type(node.op).__name__} is not supported; {_ALLOWED}")
        if abs(result) > MAX_MAGNITUDE:
            raise CalculatorError("the result is too large")
        result = Fraction(result)
        if _bits(result) > MAX_BITS:
            raise CalculatorError("the result is too precise (its denominator is too large)")
        return result
    if isinstance(node, ast.Tuple):
        raise CalculatorError(f"commas only separate thousands (48,210); {_ALLOWED}")
    if isinstance(node, ast.Name):
        raise CalculatorError(f"unknown name {node.id!r}: {_ALLOWED}")
    raise CalculatorError(_ALLOWED)


def _bits(value: Fraction) -> int:
    """Size of a fraction: the longer of its numerator and denominator, in bits."""
    return max(value.numerator.bit_length(), value.denominator.bit_length())


def evaluate(expression: str) -> Fraction:
    """Evaluate an arithmetic expression exactly; raise :class:`CalculatorError` (a ToolError) when it cannot."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("give an expression such as 23+45*2")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = _THOUSANDS.sub("", expression.strip().removesuffix("=").strip())
    for written, python in _SPELLINGS.items():
        text = text.replace(written, python)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r}; write something like 23+45*2") from None
    try:
        return _evaluate(tree)
    except RecursionError:  # pragma: no cover - 200 characters cannot nest this deep
        raise CalculatorError("the expression is nested too deeply") from None


def format_number(value: Fraction) -> str:
    """Whole numbers as integers, others as decimals rounded to six places (trailing zeros dropped)."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = round(value * 10**DECIMAL_PLACES)  # an int, rounded half to even
    whole, fraction = divmod(abs(scaled), 10**DECIMAL_PLACES)
    digits = f"{whole}.{fraction:0{DECIMAL_PLACES}d}".rstrip("0").rstrip(".")
    return "-" + digits if scaled < 0 else digits


def calculate(expression: str) -> str:
    """Evaluate and format: what the ``calculator`` tool answers."""
    return format_number(evaluate(expression))


@tool(name="calculator")
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. 23+45*2
    """
    # A worker thread: bounded work, but still never on the event loop that runs the tool timeout.
    return await asyncio.to_thread(calculate, expression)
