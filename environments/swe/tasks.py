"""SWE tasks: SWE-bench rows (the format SWE-bench, SWE-Gym, R2E-Gym and SWE-smith publish), validated.

A row has ``instance_id``, ``repo`` ("owner/name"), ``base_commit``, ``problem_statement``, ``patch`` (the
reference fix, never shown), ``test_patch`` (the tests that check it, never shown), ``FAIL_TO_PASS`` and
``PASS_TO_PASS`` (pytest node ids, as lists or as JSON strings of lists); optional ``test_cmd`` (default
``pytest``), ``repo_path`` (where the repository is, instead of ``repos_dir``); ``hints_text`` and any other
field are ignored. Malformed rows fail at load with the row and the field named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_env import TaskError
from forge_env.workspace import read_jsonl

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
            "FAIL_TO_PASS", "PASS_TO_PASS")
_COMMIT = re.compile(r"[0-9a-fA-F]{4,64}")
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


class SWETaskError(TaskError):
    """A row is not a valid SWE task; the message names the row and the field."""


@dataclass(frozen=True)
class SWETask:
    """One validated SWE-bench row."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_cmd: str = "pytest"
    repo_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def mirror_name(self) -> str:
        """The directory name SWE-bench tooling gives a local mirror: ``owner__name``."""
        return self.repo.replace("/", "__")

    def to_row(self) -> dict[str, Any]:
        """The row as published (lists stored as lists)."""
        row = {"instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
               "problem_statement": self.problem_statement, "patch": self.patch, "test_patch": self.test_patch,
               "FAIL_TO_PASS": list(self.fail_to_pass), "PASS_TO_PASS": list(self.pass_to_pass),
               "test_cmd": self.test_cmd}
        if self.repo_path:
            row["repo_path"] = self.repo_path
        return row


def _test_list(value: Any, where: str, name: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SWETaskError(f"{where}: field {name!r} is a string but not a JSON list ({exc.msg})") from None
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) and t.strip() for t in value):
        raise SWETaskError(f"{where}: field {name!r} must be a list of test ids (strings), got {value!r:.200}")
    return tuple(value)


def parse_task(row: Mapping[str, Any], where: str = "row") -> SWETask:
    """Validate one row; :class:`SWETaskError` names ``where`` and the field that is wrong."""
    if isinstance(row, SWETask):
        return row
    if not isinstance(row, Mapping):
        raise SWETaskError(f"{where}: a task must be a dict (a SWE-bench row), got {type(row).__name__}")
    missing = [name for name in REQUIRED if name not in row]
    if missing:
        raise SWETaskError(f"{where}: missing field(s) {missing}; a SWE-bench row has {list(REQUIRED)}")
    for name in ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch"):
        if not isinstance(row[name], str) or not row[name].strip():
            raise SWETaskError(f"{where}: field {name!r} must be a non-empty string, got {row[name]!r:.100}")
    if not _REPO.fullmatch(row["repo"]):
        raise SWETaskError(f"{where}: field 'repo' must look like 'owner/name', got {row['repo']!r}")
    if not _COMMIT.fullmatch(row["base_commit"]):
        raise SWETaskError(f"{where}: field 'base_commit' must be a hex commit id, got {row['base_commit']!r}")
    fail_to_pass = _test_list(row["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
    pass_to_pass = _test_list(row["PASS_TO_PASS"], where, "PASS_TO_PASS")
    if not fail_to_pass:
        raise SWETaskError(f"{where}: field 'FAIL_TO_PASS' is empty; a task needs a test that the fix makes pass")
    test_cmd = row.get("test_cmd") or "pytest"
    if test_cmd != "pytest":
        raise SWETaskError(f"{where}: field 'test_cmd' {test_cmd!r} is not supported; only 'pytest' is (its "
                           f"per-test report is what grading reads)")
    repo_path = row.get("repo_path")
    if repo_path is not None and not isinstance(repo_path, str | Path):
        raise SWETaskError(f"{where}: field 'repo_path' must be a path string, got {type(repo_path).__name__}")
    extra = {k: v for k, v in row.items() if k not in REQUIRED and k not in ("test_cmd", "repo_path")}
    return SWETask(instance_id=row["instance_id"], repo=row["repo"], base_commit=row["base_commit"],
                   problem_statement=row["problem_statement"], patch=row["patch"], test_patch=row["test_patch"],
                   fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, test_cmd=test_cmd,
                   repo_path=str(repo_path) if repo_path else None, extra=extra)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``.jsonl`` file or a ``.json`` file holding a list of rows (hidden from sandboxes: they
    hold the patches and hidden tests)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"SWE task file {path} does not exist")
    return read_jsonl(path, error=SWETaskError)


def parse_tasks(rows: Iterable[Mapping[str, Any]], source: str) -> list[SWETask]:
    """Validate rows; errors name ``source``, the row number and its instance id."""
    tasks = []
    for index, row in enumerate(rows):
        name = row.get("instance_id") if isinstance(row, Mapping) else None
        tasks.append(parse_task(row, f"{source} row {index}" + (f" ({name})" if name else "")))
    if not tasks:
        raise SWETaskError(f"{source} holds no rows")
    ids = [t.instance_id for t in tasks]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SWETaskError(f"{source}: duplicate instance_id(s) {duplicates[:5]}")
    return tasks


def load_swe_tasks(source: Any, *, limit: int | None = None) -> list[SWETask]:
    """Tasks from a ``.jsonl``/``.json`` path, a list of row dicts, or a ``datasets`` dataset (any iterable
    of mappings). Nothing is fetched: a hub dataset must already be loaded by the caller."""
    if isinstance(source, str | Path):
        rows: Iterable[Mapping[str, Any]] = read_rows(source)
        name = str(source)
    elif isinstance(source, Mapping):
        raise SWETaskError("load_swe_tasks takes a list of rows, not a single row; wrap it in a list")
    else:
        try:
            rows = list(source)
        except TypeError:
            raise SWETaskError(f"cannot read SWE tasks from a {type(source).__name__}; pass a .jsonl/.json path, "
                               f"a list of rows or a datasets.Dataset") from None
        name = type(source).__name__
    rows = list(rows)[:limit] if limit is not None else list(rows)
    return parse_tasks(rows, name)
