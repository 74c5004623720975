"""Reading grading data: records of a JSON Lines (or JSON list) file, hidden from every sandbox.

A dataset file holds the hidden tests and reference solutions of its tasks: :func:`read_jsonl` hides it
from sandboxes (``forge_env.sandbox.hide_from_sandboxes``) before it reads it, so no code it grades can read
the answer key. Coding-v0's task files and SWE-v0's rows are read with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge_env.sandbox import hide_from_sandboxes


def read_jsonl(path: str | Path, *, error: type[Exception] = ValueError) -> list[dict[str, Any]]:
    """Records of a JSON Lines file (or a ``.json`` file holding a list); a malformed file raises ``error``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no dataset file at {path}")
    hide_from_sandboxes(path)  # tests and reference solutions: never readable by the code they grade
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        records = json.loads(text)
        if not isinstance(records, list):
            raise error(f"{path} must hold a JSON list of objects")
        return records
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number} is not valid JSON: {exc.msg}") from None
    return records
