"""AST mutations that inject one small bug into a Python source file, keeping the rest of the text intact.

Operators (SWE-smith style): flipped comparisons, off-by-one constants, dropped statements, swapped call
arguments, wrong arithmetic or boolean operators. A :class:`Mutation` names the file, the source span it
replaces and the replacement; the span is re-printed with ``ast.unparse``, so a diff touches one place.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass

COMPARE_FLIPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
               ast.Div: ast.Mult, ast.Mod: ast.FloorDiv}
BOOL_SWAPS = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutation:
    """Replace ``source[start:end]`` of ``path`` (character offsets) with ``replacement``."""

    path: str
    kind: str
    line: int
    start: int
    end: int
    replacement: str

    def apply(self, source: str) -> str:
        return source[:self.start] + self.replacement + source[self.end:]


def _offsets(source: str) -> list[int]:
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _span(node: ast.AST, lines: list[int], source: str) -> tuple[int, int] | None:
    if getattr(node, "end_lineno", None) is None:
        return None
    # ast offsets are in UTF-8 bytes; convert within the line
    def offset(line: int, col: int) -> int:
        text = source[lines[line - 1]:lines[line]]
        return lines[line - 1] + len(text.encode()[:col].decode(errors="ignore"))
    return offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)


def _expression(node: ast.expr, source: str, lines: list[int], path: str, kind: str, new: ast.expr
                ) -> Mutation | None:
    span = _span(node, lines, source)
    if span is None:
        return None
    text = ast.unparse(new)
    if "\n" in source[span[0]:span[1]]:
        return None  # keep mutations on one line: easy to read in a patch
    return Mutation(path, kind, node.lineno, span[0], span[1], text)


def mutations(path: str, source: str) -> Iterator[Mutation]:
    """Every single mutation of ``source``, in source order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    lines = _offsets(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE_FLIPS:
            new = copy.deepcopy(node)
            new.ops = [COMPARE_FLIPS[type(node.ops[0])]()]
            yield from _some(_expression(node, source, lines, path, "flip_comparison", new))
        elif isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAPS:
            new = copy.deepcopy(node)
            new.op = BINOP_SWAPS[type(node.op)]()
            yield from _some(_expression(node, source, lines, path, "wrong_operator", new))
        elif isinstance(node, ast.BoolOp) and type(node.op) in BOOL_SWAPS:
            new = copy.deepcopy(node)
            new.op = BOOL_SWAPS[type(node.op)]()
            yield from _some(_expression(node, source, lines, path, "wrong_boolean", new))
        elif (isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 100):
            yield from _some(_expression(node, source, lines, path, "off_by_one", ast.Constant(node.value + 1)))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            new = copy.deepcopy(node)
            new.args[0], new.args[1] = new.args[1], new.args[0]
            if ast.dump(new) != ast.dump(node):
                yield from _some(_expression(node, source, lines, path, "swap_arguments", new))
        if isinstance(node, ast.FunctionDef | ast.For | ast.While | ast.If | ast.With):
            body = node.body
            for statement in body:
                if len(body) < 2 or not isinstance(statement, ast.Assign | ast.AugAssign | ast.Expr | ast.Return):
                    continue
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    continue  # a docstring
                span = _span(statement, lines, source)
                if span is None or statement.lineno != statement.end_lineno:
                    continue
                yield Mutation(path, "drop_statement", statement.lineno, span[0], span[1], "pass")


def _some(mutation: Mutation | None) -> Iterator[Mutation]:
    if mutation is not None:
        yield mutation
