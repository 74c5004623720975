"""Harbor task directories (the Terminal-Bench 2.0 format) read into :class:`TerminalTask`.

A task directory holds ``instruction.md`` (the prompt), ``task.toml`` (configuration), ``environment/``
(a ``Dockerfile`` and its build context, unless ``[environment].docker_image`` names a prebuilt image),
``tests/test.sh`` (the verifier's entry point, with whatever it needs) and, optionally, ``solution/solve.sh``.

``task.toml`` is read the way Harbor reads it: keys this loader does not know (``[metadata]``, ``[task]``,
``[solution]``, resource hints) are kept or ignored, as Harbor ignores them; the keys it uses must have the
right types, and features Terminal-v0 cannot honour (multi-step tasks, a separate verifier environment, a
Windows image, docker-compose environments, GPUs) are refused here with a message that says so, rather than
run differently from Harbor. Every problem is a :class:`TerminalTaskError` naming the file and the key.
"""

from __future__ import annotations

import hashlib
import posixpath
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 600.0
#: What a task directory must hold.
REQUIRED = ("instruction.md", "task.toml", "tests/test.sh")


class TerminalTaskError(ValueError):
    """A task directory that cannot be used (the message names the file and what is wrong)."""


@dataclass(frozen=True)
class TerminalTask:
    """One Harbor task (see the module docstring). ``path``: the task directory."""

    name: str
    path: Path
    instruction: str
    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_env: dict[str, str] = field(default_factory=dict)
    verifier_user: str = "root"
    docker_image: str | None = None
    workdir: str | None = None
    build_timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int | None = None
    storage_mb: int | None = None
    cpus: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution(self) -> str | None:
        """``solution/solve.sh``'s text, when the task has one."""
        script = self.path / "solution" / "solve.sh"
        return script.read_text() if script.is_file() else None

    def to_row(self) -> dict[str, Any]:
        """The JSON task row an episode is reset with."""
        return {"task_id": self.name, "task_dir": str(self.path)}


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise TerminalTaskError(f"{where}: [{key}] must be a table, got {type(value).__name__}")
    return value


def _number(table: dict[str, Any], key: str, where: str, default: float | None) -> float | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TerminalTaskError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def _string(table: dict[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TerminalTaskError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _env(table: dict[str, Any], where: str) -> dict[str, str]:
    value = table.get("env", {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TerminalTaskError(f"{where}: env must be a table of strings, got {value!r}")
    return dict(value)


def parse_config(text: str, where: str) -> dict[str, Any]:
    """The fields of a ``task.toml`` that Terminal-v0 uses (see the module docstring)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TerminalTaskError(f"{where}: not valid TOML ({exc})") from None
    if "steps" in data:
        raise TerminalTaskError(f"{where}: multi-step tasks ([[steps]]) are not supported by Terminal-v0")
    verifier = _table(data, "verifier", where)
    agent = _table(data, "agent", where)
    environment = _table(data, "environment", where)
    task = _table(data, "task", where)
    metadata = _table(data, "metadata", where)
    _table(data, "solution", where)
    if verifier.get("environment_mode", "shared") != "shared" or "environment" in verifier:
        raise TerminalTaskError(f"{where}: a separate verifier environment ([verifier].environment_mode = "
                                f"\"separate\") is not supported; Terminal-v0 always verifies in a fresh "
                                f"container from the agent's final file system")
    if environment.get("os", "linux") != "linux":
        raise TerminalTaskError(f"{where}: [environment].os = {environment['os']!r} is not supported (linux only)")
    gpus = environment.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise TerminalTaskError(f"{where}: [environment].gpus must be a non-negative int, got {gpus!r}")
    if gpus:
        raise TerminalTaskError(f"{where}: tasks that need GPUs ([environment].gpus = {gpus}) are not supported")
    notes = []
    if environment.get("allow_internet") is True:
        notes.append("allow_internet = true is not honoured: task containers never have a network")
    user = _string(agent, "user", where)
    if user is not None:
        notes.append(f"[agent].user = {user!r} is not honoured: the agent always runs as an unprivileged uid")
    workdir = _string(environment, "workdir", where)
    if workdir is not None and not posixpath.isabs(workdir):
        raise TerminalTaskError(f"{where}: [environment].workdir must be an absolute path, got {workdir!r}")
    memory = environment.get("memory_mb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0):
        raise TerminalTaskError(f"{where}: [environment].memory_mb must be a positive int, got {memory!r}")
    storage = environment.get("storage_mb")
    if storage is not None and (isinstance(storage, bool) or not isinstance(storage, int) or storage <= 0):
        raise TerminalTaskError(f"{where}: [environment].storage_mb must be a positive int, got {storage!r}")
    name = task.get("name")
    if name is not None and not isinstance(name, str):
        raise TerminalTaskError(f"{where}: [task].name must be a string, got {name!r}")
    return {
        "name": name,
        "agent_timeout_s": _number(agent, "timeout_sec", f"{where} [agent]", DEFAULT_TIMEOUT_S),
        "verifier_timeout_s": _number(verifier, "timeout_sec", f"{where} [verifier]", DEFAULT_TIMEOUT_S),
        "verifier_env": _env(verifier, f"{where} [verifier]"),
        "verifier_user": _string(verifier, "user", where) or "root",
        "docker_image": _string(environment, "docker_image", where),
        "workdir": workdir,
        "build_timeout_s": _number(environment, "build_timeout_sec", f"{where} [environment]", DEFAULT_TIMEOUT_S),
        "memory_mb": memory,
        "storage_mb": storage,
        "cpus": _number(environment, "cpus", f"{where} [environment]", None),
        "metadata": metadata,
        "notes": tuple(notes),
    }


def load_task(path: str | Path) -> TerminalTask:
    """Read one task directory; TerminalTaskError when it is not a usable Harbor task."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise TerminalTaskError(f"{path}: not a directory (a Harbor task is a directory)")
    for required in REQUIRED:
        if not (root / required).is_file():
            raise TerminalTaskError(f"{root}: a Harbor task needs {required}")
    config = parse_config((root / "task.toml").read_text(), str(root / "task.toml"))
    env_dir = root / "environment"
    if (env_dir / "docker-compose.yaml").exists() or (env_dir / "docker-compose.yml").exists():
        raise TerminalTaskError(f"{root}: docker-compose environments are not supported (one Dockerfile only)")
    if config["docker_image"] is None and not (env_dir / "Dockerfile").is_file():
        raise TerminalTaskError(f"{root}: needs environment/Dockerfile or [environment].docker_image in task.toml")
    instruction = (root / "instruction.md").read_text()
    if not instruction.strip():
        raise TerminalTaskError(f"{root}/instruction.md is empty")
    name = config.pop("name") or root.name
    return TerminalTask(name=name, path=root, instruction=instruction, **config)


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


def load_tasks(source: str | Path | list[Any]) -> list[TerminalTask]:
    """Tasks from one task directory, a directory of task directories, or a list of either (or of tasks)."""
    if isinstance(source, list | tuple):
        found: list[TerminalTask] = []
        for item in source:
            found.extend([item] if isinstance(item, TerminalTask) else load_tasks(item))
        return _unique(found)
    root = Path(source)
    if not root.is_dir():
        raise TerminalTaskError(f"{source}: no such directory (give a Harbor task directory or a directory of them)")
    if is_task_dir(root):
        return [load_task(root)]
    children = sorted(p for p in root.iterdir() if p.is_dir() and is_task_dir(p))
    if not children:
        raise TerminalTaskError(f"{root}: holds no Harbor task (no task.toml in it or its subdirectories)")
    return _unique([load_task(child) for child in children])


def _unique(tasks: list[TerminalTask]) -> list[TerminalTask]:
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.name in seen and seen[task.name] != task.path:
            raise TerminalTaskError(f"two tasks are named {task.name!r}: {seen[task.name]} and {task.path}")
        seen[task.name] = task.path
    return tasks


def tree_digest(directory: Path) -> str:
    """A content hash of a directory (relative paths, modes and bytes; symlinks by target)."""
    digest = hashlib.sha256()
    for item in sorted(directory.rglob("*")):
        rel = item.relative_to(directory).as_posix()
        if item.is_symlink():
            digest.update(f"L {rel} {item.readlink()}\n".encode())
        elif item.is_file():
            digest.update(f"F {rel} {item.stat().st_mode & 0o777:o} {item.stat().st_size}\n".encode())
            digest.update(item.read_bytes())
        elif item.is_dir():
            digest.update(f"D {rel}\n".encode())
    return digest.hexdigest()
