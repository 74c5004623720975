"""Constant expressions of test code, evaluated on the host for the calls-only grading path.

``ast.literal_eval`` accepts literals only, so ``assert f(3 * 19) == [3, 19]`` or ``... == 2.0 / 3.0`` (ten
of HumanEval's tests) sent whole tasks to the dearer judge/candidate path. :func:`constant` also folds
arithmetic on literals and ``tuple(...)``/``list(...)`` of a constant: the same operations Python would do
in the judge, on the same values, so a task graded either way gets the same answer. The test code is
trusted task data; the bounds below only keep a typo such as ``10 ** 10 ** 10`` from stalling the host:
what exceeds them is simply not a constant, and the task keeps the judge path.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Collection
from typing import Any

#: What ``constant`` returns for an expression it does not evaluate.
NOT_CONSTANT = object()

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_CONVERSIONS = {"tuple": tuple, "list": list}
_MAX_DEPTH = 100
_MAX_ITEMS = 100_000  # elements of a sequence built by * or +
_MAX_BITS = 100_000  # of an int result
_MAX_EXPONENT = 128
_SEQUENCES = (str, bytes, list, tuple)


def constant(node: ast.AST, shadowed: Collection[str] = ()) -> Any:
    """The value of ``node`` when it is a literal, arithmetic on literals, or ``tuple``/``list`` of one;
    else NOT_CONSTANT. ``shadowed``: names that are not the builtins here (the solution's functions)."""
    try:
        return _fold(node, frozenset(shadowed), 0)
    except (ValueError, TypeError, ArithmeticError, RecursionError, MemoryError):
        return NOT_CONSTANT


def _fold(node: ast.AST, shadowed: frozenset[str], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deeply")
    depth += 1
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            raise ValueError("not a value")
        return node.value
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = [_fold(item, shadowed, depth) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items if isinstance(node, ast.List) else set(items)
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ValueError("dict unpacking")
        return {_fold(k, shadowed, depth): _fold(v, shadowed, depth) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _fold(node.operand, shadowed, depth)
        if not _number(value):
            raise TypeError("not a number")
        return _UNARY[type(node.op)](value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _fold(node.left, shadowed, depth), _fold(node.right, shadowed, depth)
        _check_bounds(node.op, left, right)
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > _MAX_BITS:
            raise ValueError("too large")
        return value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONVERSIONS
            and node.func.id not in shadowed and len(node.args) == 1 and not node.keywords):
        value = _fold(node.args[0], shadowed, depth)
        if not isinstance(value, _SEQUENCES):
            raise TypeError("not a sequence")
        return _CONVERSIONS[node.func.id](value)
    raise ValueError("not a constant")


def _number(value: Any) -> bool:
    return isinstance(value, int | float | complex)  # (bool is an int, as in Python)


def _check_bounds(op: ast.operator, left: Any, right: Any) -> None:
    if isinstance(op, ast.Pow):
        if not (_number(left) and _number(right)) or (isinstance(right, int) and abs(right) > _MAX_EXPONENT):
            raise ValueError("power out of bounds")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() * abs(right) > _MAX_BITS:
            raise ValueError("power out of bounds")
    elif isinstance(op, ast.Mod) and isinstance(left, str | bytes):
        raise ValueError("no %-formatting")
    elif isinstance(op, ast.Mult) and (isinstance(left, _SEQUENCES) or isinstance(right, _SEQUENCES)):
        sequence, count = (left, right) if isinstance(left, _SEQUENCES) else (right, left)
        if not isinstance(count, int) or len(sequence) * max(count, 0) > _MAX_ITEMS:
            raise ValueError("repetition out of bounds")
