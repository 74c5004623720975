"""Loading math tasks: the bundled GSM8K sample, the hub (GSM8K, MATH-style), local JSONL/JSON/Parquet.

Every loader returns tasks as plain dicts ``{"question", "answer", "task_id"}`` built
through a field mapping, so any dataset whose columns are named differently works
(``question_field="problem"``). GSM8K references keep their ``#### 18`` form and MATH
references may be bare answers or whole solutions with a ``\\boxed{}``; the grader
handles both. The hub is only reached by ``load_hub`` / ``load_gsm8k`` / ``load_math``
(through ``datasets.load_dataset``, which also accepts a local dataset directory);
``forge-env`` works offline with the bundled sample (200 GSM8K training problems, MIT
licence in ``GSM8K_LICENSE.txt``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Task = dict[str, Any]

GSM8K_SAMPLE = Path(__file__).with_name("gsm8k_train_sample.jsonl")


class DatasetFormatError(ValueError):
    """A dataset's records do not have the fields the field mapping names."""


@dataclass(frozen=True)
class FieldMap:
    """Which record fields hold the question, the reference answer and (optionally) an id."""

    question: str = "question"
    answer: str = "answer"
    task_id: str | None = None


def records_to_tasks(records: Iterable[dict[str, Any]], fields: FieldMap, source: str,
                     limit: int | None = None) -> list[Task]:
    """Map raw records to tasks; raise DatasetFormatError naming the missing field and the ones present."""
    tasks: list[Task] = []
    for index, record in enumerate(records):
        if limit is not None and index >= limit:
            break
        for wanted, option in ((fields.question, "question_field"), (fields.answer, "answer_field"),
                               (fields.task_id, "id_field")):
            if wanted is not None and wanted not in record:
                raise DatasetFormatError(
                    f"record {index} of {source} has no field {wanted!r} (it has {sorted(record)}); "
                    f"pass {option}= to name the right one"
                )
        answer = record[fields.answer]
        task_id = record[fields.task_id] if fields.task_id else f"{source}-{index}"
        tasks.append({"question": str(record[fields.question]), "answer": str(answer), "task_id": str(task_id)})
    if not tasks:
        raise DatasetFormatError(f"{source} holds no records")
    return tasks


def load_jsonl(path: str | Path, *, question_field: str = "question", answer_field: str = "answer",
               id_field: str | None = None, limit: int | None = None) -> list[Task]:
    """Tasks from a JSON Lines file (one object per line) or a ``.json`` file holding a list of objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no dataset file at {path}")
    with path.open(encoding="utf-8") as handle:
        if path.suffix == ".json":
            records = json.load(handle)
            if not isinstance(records, list):
                raise DatasetFormatError(f"{path} must hold a JSON list of objects")
        else:
            records = []
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DatasetFormatError(f"{path}:{number} is not valid JSON: {exc.msg}") from None
    return records_to_tasks(records, FieldMap(question_field, answer_field, id_field), path.stem, limit)


def load_parquet(path: str | Path, *, question_field: str = "question", answer_field: str = "answer",
                 id_field: str | None = None, limit: int | None = None) -> list[Task]:
    """Tasks from a Parquet file (read with pyarrow, which ``datasets`` brings along)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no dataset file at {path}")
    records = pq.read_table(path).to_pylist()
    return records_to_tasks(records, FieldMap(question_field, answer_field, id_field), path.stem, limit)


def load_local(path: str | Path, **mapping: Any) -> list[Task]:
    """A local ``.jsonl``/``.json``/``.parquet`` file, chosen by suffix; ``mapping`` as for ``load_jsonl``."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return load_jsonl(path, **mapping)
    if suffix == ".parquet":
        return load_parquet(path, **mapping)
    raise ValueError(f"unsupported dataset file {path}: use .jsonl, .json or .parquet")


def load_hub(path: str, name: str | None = None, *, split: str = "train", question_field: str = "question",
             answer_field: str = "answer", id_field: str | None = None, limit: int | None = None,
             **load_kwargs: Any) -> list[Task]:
    """Tasks from ``datasets.load_dataset(path, name, split=split)``: a hub id or a local dataset directory."""
    import datasets

    dataset = datasets.load_dataset(path, name, split=split, **load_kwargs)
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    source = f"{path.rstrip('/').rsplit('/', 1)[-1]}-{split}"
    return records_to_tasks(dataset, FieldMap(question_field, answer_field, id_field), source)


def load_gsm8k(split: str = "train", *, path: str = "openai/gsm8k", name: str = "main",
               limit: int | None = None, **load_kwargs: Any) -> list[Task]:
    """GSM8K (``openai/gsm8k``, config ``main``): ``question`` and ``answer`` ending in ``#### N``."""
    return load_hub(path, name, split=split, limit=limit, **load_kwargs)


def load_math(split: str = "test", *, path: str = "HuggingFaceH4/MATH-500", name: str | None = None,
              question_field: str = "problem", answer_field: str = "answer", id_field: str | None = "unique_id",
              limit: int | None = None, **load_kwargs: Any) -> list[Task]:
    """A MATH-style dataset (default ``HuggingFaceH4/MATH-500``: ``problem``, ``answer``, ``unique_id``).

    For the full Hendrycks MATH (``solution`` holds a boxed answer) pass e.g.
    ``path="EleutherAI/hendrycks_math", name="algebra", split="train", answer_field="solution", id_field=None``.
    """
    return load_hub(path, name, split=split, question_field=question_field, answer_field=answer_field,
                    id_field=id_field, limit=limit, **load_kwargs)


def load_gsm8k_sample(limit: int | None = None) -> list[Task]:
    """The bundled 200 GSM8K training problems (works offline)."""
    return load_jsonl(GSM8K_SAMPLE, limit=limit)


NAMED_DATASETS = ("gsm8k_sample", "gsm8k", "math")


def load_tasks(dataset: str = "gsm8k_sample", *, split: str | None = None, **mapping: Any) -> list[Task]:
    """Tasks by name or path: ``"gsm8k_sample"`` (bundled), ``"gsm8k"`` and ``"math"`` (hub), a local
    ``.jsonl``/``.json``/``.parquet`` file, or any other hub id / dataset directory (``load_hub``)."""
    if dataset == "gsm8k_sample":
        return load_gsm8k_sample(mapping.get("limit"))
    if dataset == "gsm8k":
        return load_gsm8k(split or "train", **mapping)
    if dataset == "math":
        return load_math(split or "test", **mapping)
    if Path(dataset).suffix.lower() in (".jsonl", ".json", ".parquet"):
        return load_local(dataset, **mapping)
    return load_hub(dataset, split=split or "train", **mapping)
