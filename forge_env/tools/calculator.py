"""A safe calculator: arithmetic expressions evaluated by walking their syntax tree.

``evaluate("12 * (3 + 4)")`` parses the text with :mod:`ast` and evaluates only numbers,
``+ - * / // % **``, unary signs, parentheses and a few functions (``abs``, ``round``,
``min``, ``max``, ``sqrt``). Nothing is ever passed to ``eval``; names, attributes,
calls to anything else and oversized numbers are refused with a :class:`CalculatorError`
whose message says what to write instead. :data:`calculator` is the same thing as an
environment tool.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from forge_env.tools.tool import ToolError, tool

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1_000
MAX_MAGNITUDE = 10**300  # larger results are refused rather than printed as 300-digit numbers

Number = int | float


class CalculatorError(ToolError):
    """The expression cannot be evaluated; the message says why and what to write instead."""


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
}
# Symbols people (and models) write for arithmetic that Python spells differently.
_SPELLINGS = {"×": "*", "÷": "/", "−": "-", "^": "**"}


def _check_size(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("the result is too large (over 1e300)")
    return value


def _evaluate_node(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate_node(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {node.value!r}")
        return _check_size(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate_node(node.left), _evaluate_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is too large (the limit is {MAX_EXPONENT})")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise CalculatorError("division by zero")
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except OverflowError:
            raise CalculatorError("the result is too large") from None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise CalculatorError(f"{node.func.id}() takes no keyword arguments")
        arguments = [_evaluate_node(argument) for argument in node.args]
        try:
            return _check_size(_FUNCTIONS[node.func.id](*arguments))
        except (TypeError, ValueError) as exc:
            raise CalculatorError(f"{node.func.id}(): {exc}") from None
    if isinstance(node, ast.Tuple):
        raise CalculatorError("commas are not allowed between numbers; write 48210, not 48,210")
    if isinstance(node, ast.Name):
        raise CalculatorError(f"unknown name {node.id!r}; use numbers and {', '.join(_FUNCTIONS)}")
    raise CalculatorError(f"unsupported syntax: {ast.unparse(node)!r}; use numbers, + - * / // % ** and parentheses")


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression safely; raise :class:`CalculatorError` on anything else."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("the expression is empty; write something like 12 * (3 + 4)")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    text = expression.strip().rstrip("=").strip()
    for written, python in _SPELLINGS.items():
        text = text.replace(written, python)
    try:
        return _evaluate_node(ast.parse(text, mode="eval"))
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r}; write something like 12 * (3 + 4)") from None
    except (RecursionError, MemoryError):
        raise CalculatorError("the expression is nested too deeply") from None


def format_number(value: Number) -> str:
    """Print a result the way a person would: integers exactly, floats with up to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".12g")
    return str(value)


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 12 * (3 + 4) - 5 / 2.

    Args:
        expression: numbers with + - * / // % ** and parentheses; abs, round, min, max, sqrt.
    """
    return format_number(evaluate(expression))
