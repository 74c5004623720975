"""Trajectories as Arrow tables: Parquet files and Hugging Face ``datasets.Dataset`` with a fixed schema.

One row per episode; the columns are :data:`TRAJECTORY_SCHEMA` (documented in ``docs/ecosystem.md``). Free-form
dicts (the task, the tools' JSON schemas, chat-API usage, rubric metrics, a tool call's arguments) are JSON text,
so every row has the same Arrow type whatever the env put in them (an empty ``task`` is ``"{}"``; Arrow has no
struct with no fields). Token ids are ``int32``, the loss mask ``int8`` and the sampler's logprobs ``float32``,
the precision both generators sample in (so nothing of theirs is lost; a float64 value is rounded to float32).

Every row carries ``schema_version``. A reader accepts its own version and older ones, refuses a newer one and
names the column that is missing or has the wrong type; columns it does not know are ignored (add your own).
The JSONL form (``Trajectory.to_json``, one object a line) is read too: it is where these rows come from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from agents.trajectory import Trajectory, read_jsonl, write_jsonl

if TYPE_CHECKING:
    import datasets

#: Bump when a column is added or changes meaning; readers accept every version up to theirs.
TRAJECTORY_SCHEMA_VERSION = 1
#: Key of the Parquet file's key-value metadata holding the schema version (the column is the authority).
METADATA_KEY = b"forge_env.trajectory_schema"

TURN_TYPE = pa.struct([
    ("prompt_start", pa.int64()), ("gen_start", pa.int64()), ("gen_end", pa.int64()),
    ("policy_version", pa.int64()), ("finish_reason", pa.string()), ("num_cached_tokens", pa.int64()),
    ("reward", pa.float64()), ("generation_s", pa.float64()), ("env_s", pa.float64()),
])
#: Message fields with a column; ``tool_calls`` is JSON text. A null field is a key the message did not have;
#: anything else (another key, a ``None`` value, content given as a list of parts) is kept in ``extra`` (JSON).
MESSAGE_TEXT_FIELDS = ("role", "content", "tool_call_id", "name", "reasoning_content")
MESSAGE_TYPE = pa.struct([
    ("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.string()), ("tool_call_id", pa.string()),
    ("name", pa.string()), ("reasoning_content", pa.string()), ("extra", pa.string()),
])
DRIFT_FIELDS = (("turn", pa.int64()), ("where", pa.string()), ("token_index", pa.int64()), ("kind", pa.string()),
                ("held", pa.string()), ("rendered", pa.string()), ("detected_at_turn", pa.int64()))
DRIFT_TYPE = pa.struct(list(DRIFT_FIELDS))

TRAJECTORY_SCHEMA = pa.schema([
    pa.field("schema_version", pa.int32(), nullable=False),
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("env_id", pa.string(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("seed", pa.int64()),
    pa.field("task", pa.string(), nullable=False),
    pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
    pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
    pa.field("turns", pa.list_(TURN_TYPE), nullable=False),
    pa.field("messages", pa.list_(MESSAGE_TYPE), nullable=False),
    pa.field("tools", pa.string(), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("terminated", pa.bool_(), nullable=False),
    pa.field("truncated", pa.bool_(), nullable=False),
    pa.field("truncation_reason", pa.string()),
    pa.field("status", pa.string(), nullable=False),
    pa.field("error", pa.string()),
    pa.field("error_kind", pa.string()),
    pa.field("level", pa.string(), nullable=False),
    pa.field("endpoint_retries", pa.int64(), nullable=False),
    pa.field("usage", pa.string(), nullable=False),
    pa.field("metrics", pa.string(), nullable=False),
    pa.field("drift", pa.list_(DRIFT_TYPE), nullable=False),
    pa.field("segment_starts", pa.list_(pa.int64()), nullable=False),
    pa.field("generation_s", pa.float64(), nullable=False),
    pa.field("env_s", pa.float64(), nullable=False),
    pa.field("total_s", pa.float64(), nullable=False),
])
#: Columns holding JSON text, and the Python type each must decode to.
JSON_COLUMNS = {"task": dict, "tools": list, "usage": dict, "metrics": dict}
#: The version each column appeared in: a file of an older version may lack the newer ones (they get defaults).
COLUMN_SINCE = {name: 1 for name in TRAJECTORY_SCHEMA.names}

INT32_MAX = 2**31 - 1


class TrajectorySchemaError(ValueError):
    """A table, Parquet file or dataset does not hold trajectories of a schema this reader knows."""


# ------------------------------------------------------------------ Trajectory -> rows


def _message_row(message: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in message.items():
        if key in MESSAGE_TEXT_FIELDS and isinstance(value, str):
            row[key] = value
        elif key == "tool_calls" and value is not None:
            row[key] = json.dumps(value)
        else:
            extra[key] = value
    if "role" not in row:
        raise TrajectorySchemaError(f"a message has no string 'role': {message!r}"[:300])
    row["extra"] = json.dumps(extra) if extra else None
    return row


def _drift_row(record: dict[str, Any]) -> dict[str, Any]:
    unknown = set(record) - {name for name, _ in DRIFT_FIELDS}
    if unknown:
        raise TrajectorySchemaError(f"a drift record has fields the schema has no column for: {sorted(unknown)}")
    return record


def trajectory_row(trajectory: Trajectory) -> dict[str, Any]:
    """One trajectory as a row of :data:`TRAJECTORY_SCHEMA` (plain Python values)."""
    data = trajectory.to_dict()
    if any(not 0 <= token <= INT32_MAX for token in trajectory.token_ids):
        raise TrajectorySchemaError(f"episode {trajectory.episode_id}: a token id does not fit int32")
    if any(bit not in (0, 1) for bit in trajectory.loss_mask):
        raise TrajectorySchemaError(f"episode {trajectory.episode_id}: loss_mask holds values other than 0 and 1")
    data["schema_version"] = TRAJECTORY_SCHEMA_VERSION
    for name in JSON_COLUMNS:
        data[name] = json.dumps(data[name])
    data["messages"] = [_message_row(message) for message in trajectory.messages]
    data["drift"] = [_drift_row(record) for record in trajectory.drift]
    return data


def to_table(trajectories: Iterable[Trajectory]) -> pa.Table:
    """The trajectories as an Arrow table of :data:`TRAJECTORY_SCHEMA`, one row each."""
    rows = [trajectory_row(trajectory) for trajectory in trajectories]
    table = pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
    return table.replace_schema_metadata({METADATA_KEY: str(TRAJECTORY_SCHEMA_VERSION).encode()})


def to_dataset(trajectories: Iterable[Trajectory]) -> datasets.Dataset:
    """The trajectories as a ``datasets.Dataset`` (``push_to_hub``/``to_parquet``/``filter`` as usual)."""
    import datasets

    return datasets.Dataset(datasets.table.InMemoryTable(to_table(trajectories)))


def write_parquet(trajectories: Iterable[Trajectory], path: str | Path,
                  metadata: dict[str, Any] | None = None) -> None:
    """Write a Parquet file of :data:`TRAJECTORY_SCHEMA`; ``metadata`` (JSON values) goes in its key-value metadata
    under ``forge_env.<key>``."""
    import pyarrow.parquet as pq

    table = to_table(trajectories)
    if metadata:
        extra = {f"forge_env.{key}".encode(): json.dumps(value).encode() for key, value in metadata.items()}
        table = table.replace_schema_metadata({**table.schema.metadata, **extra})
    pq.write_table(table, str(path))


# ------------------------------------------------------------------ rows -> Trajectory


def _conform(table: pa.Table) -> tuple[pa.Table, int]:
    """Check ``table`` against the schema (naming the first bad column), cast compatible types; its version."""
    names = set(table.column_names)
    if "schema_version" not in names:
        raise TrajectorySchemaError(
            f"not a forge-env trajectory table: missing column 'schema_version' (columns: {sorted(names)[:12]})")
    versions = set(table.column("schema_version").to_pylist())
    if None in versions or any(not isinstance(v, int) or v < 1 for v in versions):
        raise TrajectorySchemaError(f"column 'schema_version' holds {sorted(map(str, versions))}, not versions >= 1")
    newest = max(versions, default=TRAJECTORY_SCHEMA_VERSION)
    if newest > TRAJECTORY_SCHEMA_VERSION:
        raise TrajectorySchemaError(f"trajectories of schema version {newest}, newer than this reader's "
                                    f"{TRAJECTORY_SCHEMA_VERSION}: upgrade forge-env to read them")
    oldest = min(versions, default=TRAJECTORY_SCHEMA_VERSION)
    columns = {}
    for field in TRAJECTORY_SCHEMA:
        if field.name not in names:
            if COLUMN_SINCE[field.name] <= oldest:
                raise TrajectorySchemaError(f"not a forge-env trajectory table: missing column {field.name!r} "
                                            f"({field.type}, schema version {oldest})")
            continue
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise TrajectorySchemaError(f"column {field.name!r} has type {column.type}, the schema has "
                                            f"{field.type}") from None
        if not field.nullable and column.null_count:
            raise TrajectorySchemaError(f"column {field.name!r} has {column.null_count} null values; it may have none")
        columns[field.name] = column
    return pa.table(columns), oldest


def _json(value: str, column: str, row: int, kind: type) -> Any:
    try:
        decoded = json.loads(value)
    except json.JSONDecodeError as exc:
        raise TrajectorySchemaError(f"column {column!r}, row {row}: not JSON ({exc})") from None
    if not isinstance(decoded, kind):
        raise TrajectorySchemaError(f"column {column!r}, row {row}: JSON {type(decoded).__name__}, "
                                    f"expected {kind.__name__}")
    return decoded


def _message(row: dict[str, Any], index: int) -> dict[str, Any]:
    message = {key: value for key, value in row.items() if value is not None and key not in ("extra", "tool_calls")}
    if row.get("tool_calls") is not None:
        message["tool_calls"] = _json(row["tool_calls"], "messages.tool_calls", index, list)
    if row.get("extra") is not None:
        message.update(_json(row["extra"], "messages.extra", index, dict))
    return message


def trajectory_from_row(row: dict[str, Any], index: int = 0) -> Trajectory:
    """The trajectory of one row of :data:`TRAJECTORY_SCHEMA` (``index`` names the row in errors)."""
    data = {key: value for key, value in row.items() if key in COLUMN_SINCE and key != "schema_version"}
    for name, kind in JSON_COLUMNS.items():
        if name in data:
            data[name] = _json(data[name], name, index, kind)
    if "messages" in data:
        data["messages"] = [_message(message, index) for message in data["messages"]]
    if "drift" in data:
        data["drift"] = [{k: v for k, v in record.items() if v is not None} for record in data["drift"]]
    try:
        return Trajectory.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise TrajectorySchemaError(f"row {index}: not a trajectory ({exc})") from None


def from_table(table: pa.Table) -> list[Trajectory]:
    """The trajectories of an Arrow table of :data:`TRAJECTORY_SCHEMA` (any version up to this one)."""
    conformed, _ = _conform(table)
    return [trajectory_from_row(row, index) for index, row in enumerate(conformed.to_pylist())]


def from_dataset(dataset: datasets.Dataset) -> list[Trajectory]:
    """The trajectories of a ``datasets.Dataset`` of :data:`TRAJECTORY_SCHEMA` (filtered/shuffled ones too)."""
    return from_table(dataset.with_format("arrow")[:])


def read_parquet(path: str | Path) -> list[Trajectory]:
    """Read a Parquet file of trajectories; a file of another layout raises :class:`TrajectorySchemaError`."""
    return from_table(_read_table(path))


def parquet_metadata(path: str | Path) -> dict[str, Any]:
    """The ``forge_env.<key>`` JSON entries :func:`write_parquet` stored in the file (without the prefix)."""
    import pyarrow.parquet as pq

    stored = pq.read_schema(str(path)).metadata or {}
    out = {}
    for key, value in stored.items():
        if key.startswith(b"forge_env.") and key != METADATA_KEY:
            out[key.decode()[len("forge_env."):]] = json.loads(value)
    return out


def _read_table(path: str | Path) -> pa.Table:
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return pq.read_table(str(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise TrajectorySchemaError(f"{path}: not a Parquet file ({exc})") from None


# ------------------------------------------------------------------ files by suffix

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".json")


def write_trajectories(trajectories: Sequence[Trajectory], path: str | Path) -> None:
    """Write a ``.parquet`` file (this schema) or a ``.jsonl`` file (one ``Trajectory.to_json`` a line)."""
    suffix = Path(path).suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        write_parquet(trajectories, path)
    elif suffix in JSONL_SUFFIXES:
        write_jsonl(list(trajectories), str(path))
    else:
        raise ValueError(f"{path}: unknown trajectory file type {suffix!r}; use .parquet or .jsonl")


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Read a ``.parquet`` or ``.jsonl`` trajectories file (by its suffix)."""
    suffix = Path(path).suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return read_parquet(path)
    if suffix in JSONL_SUFFIXES:
        return read_jsonl(str(path))
    raise ValueError(f"{path}: unknown trajectory file type {suffix!r}; use .parquet or .jsonl")
