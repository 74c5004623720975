"""Math dataset loaders on local files the tests write (never the hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environments.math.loaders import (
    GSM8K_SAMPLE,
    DatasetFormatError,
    load_gsm8k,
    load_gsm8k_sample,
    load_local,
    load_math,
    load_tasks,
)


def test_bundled_gsm8k_sample_and_its_licence() -> None:
    tasks = load_gsm8k_sample()
    assert len(tasks) == 200
    assert all("####" in t["answer"] and t["question"] for t in tasks)
    assert len({t["task_id"] for t in tasks}) == 200
    assert "MIT License" in GSM8K_SAMPLE.with_name("GSM8K_LICENSE.txt").read_text()
    assert load_tasks("gsm8k_sample", limit=5) == tasks[:5]


def test_jsonl_json_and_parquet_with_a_field_mapping(tmp_path: Path) -> None:
    records = [{"problem": "1+1?", "solution": "\\boxed{2}", "uid": "a"}, {"problem": "2+2?", "solution": "4", "uid": "b"}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    (tmp_path / "d.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    mapping = {"question_field": "problem", "answer_field": "solution", "id_field": "uid"}
    expected = [{"question": "1+1?", "answer": "\\boxed{2}", "task_id": "a"}, {"question": "2+2?", "answer": "4", "task_id": "b"}]
    for name in ("d.jsonl", "d.json", "d.parquet"):
        assert load_local(tmp_path / name, **mapping) == expected
        assert load_tasks(str(tmp_path / name), limit=1, **mapping) == expected[:1]


def test_missing_field_and_bad_files_say_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "x", "answer": "1"}) + "\n")
    with pytest.raises(DatasetFormatError, match="no field 'question'.*question_field="):
        load_local(path)
    path.write_text("{not json\n")
    with pytest.raises(DatasetFormatError, match="d.jsonl:1 is not valid JSON"):
        load_local(path)
    with pytest.raises(FileNotFoundError):
        load_local(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="use .jsonl, .json or .parquet"):
        load_local(tmp_path / "d.csv")


def _hub_style_dataset(root: Path, config: str, split: str, records: list[dict]) -> None:
    """A local directory laid out like a hub dataset repo (parquet shards + README configs)."""
    folder = root / (config or "data")
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(records), folder / f"{split}-00000-of-00001.parquet")
    name = config or "default"
    (root / "README.md").write_text(
        f"---\nconfigs:\n- config_name: {name}\n  data_files:\n  - split: {split}\n    path: {folder.name}/{split}-*\n---\n"
    )


def test_gsm8k_and_math_loaders_go_through_datasets_load_dataset(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    gsm = [{"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}]
    _hub_style_dataset(tmp_path / "gsm8k", "main", "test", gsm)
    tasks = load_gsm8k("test", path=str(tmp_path / "gsm8k"), cache_dir=str(tmp_path / "cache"))
    assert tasks == [{"question": "What is 2+2?", "answer": gsm[0]["answer"], "task_id": "gsm8k-test-0"}]

    math = [{"problem": "Compute $1/2+1/4$.", "solution": "...", "answer": "\\frac{3}{4}", "unique_id": "test/1.json"},
            {"problem": "p2", "solution": "...", "answer": "5", "unique_id": "test/2.json"}]
    _hub_style_dataset(tmp_path / "math500", "", "test", math)
    tasks = load_math(path=str(tmp_path / "math500"), limit=1, cache_dir=str(tmp_path / "cache"))
    assert tasks == [{"question": "Compute $1/2+1/4$.", "answer": "\\frac{3}{4}", "task_id": "test/1.json"}]
