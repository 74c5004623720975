"""Finding the code in a model's answer: markdown fences first, else the whole text if it is Python.

Models answer with prose around one or more fenced blocks. We take, in order of preference, the last
Python block that defines the task's entry point, the last Python (or untagged) block, and finally the
whole answer when it parses as Python. An unclosed final fence (a generation cut short) still counts.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.DOTALL | re.MULTILINE)
PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})


@dataclass(frozen=True)
class ExtractedCode:
    """The code found in an answer; ``fenced`` tells whether it came from a ```python block."""

    code: str
    fenced: bool


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block of ``text`` as (language tag, body), in order."""
    return [(match.group(2).lower(), match.group(3)) for match in _FENCE.finditer(text)]


def defines(code: str, name: str) -> bool:
    """``code`` defines a top-level function or class called ``name``."""
    return re.search(rf"^(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", code, flags=re.MULTILINE) is not None


def extract_code(text: str, entry_point: str | None = None) -> ExtractedCode | None:
    """The code in ``text``, or None when there is none (see the module docstring for the rules)."""
    blocks = [body for tag, body in fenced_blocks(text) if tag in PYTHON_TAGS and body.strip()]
    if entry_point:
        defining = [body for body in blocks if defines(body, entry_point)]
        if defining:
            return ExtractedCode(defining[-1].strip("\n") + "\n", True)
    if blocks:
        return ExtractedCode(blocks[-1].strip("\n") + "\n", True)
    stripped = text.strip("\n")
    if stripped.strip():
        try:
            ast.parse(stripped)
        except SyntaxError:
            return None
        if not _looks_like_prose(stripped):
            return ExtractedCode(stripped + "\n", False)
    return None


def _looks_like_prose(text: str) -> bool:
    """A single bare name or a sentence-like expression parses as Python but is not code."""
    tree = ast.parse(text)
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Name | ast.Constant) for node in tree.body)
