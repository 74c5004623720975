"""YAML configs as dataclasses, with dotted command-line overrides.

``load_config(SchemaClass, "app.yaml", ["trainer.lr=1e-5", "loop.steps=20"])`` reads the
YAML file, applies the overrides, and builds the (nested) dataclass, checking every
key and type on the way. Mistakes are reported with the full dotted path and, for
misspelt keys, the closest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override does not match the schema; the message names the dotted key."""


#: Values a config may expand to once YAML aliases are followed (a real config has hundreds).
MAX_CONFIG_NODES = 100_000


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load``, refusing documents whose aliases expand past ``MAX_CONFIG_NODES`` values or
    refer to themselves: a 1 KB "billion laughs" file would otherwise exhaust memory once copied."""
    value = yaml.safe_load(text)
    sizes: dict[int, int] = {}

    def expanded(node: Any, path: frozenset[int]) -> int:
        if not isinstance(node, dict | list):
            return 1
        key = id(node)
        if key in path:
            raise ConfigError(f"{where}: a YAML alias refers to itself")
        if key not in sizes:
            children = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
            total = 1
            for child in children:
                total += expanded(child, path | {key})
                if total > MAX_CONFIG_NODES:
                    raise ConfigError(f"{where}: the YAML expands to more than {MAX_CONFIG_NODES} values "
                                      "(aliases repeated inside aliases); write the values out")
            sizes[key] = total
        return sizes[key]

    expanded(value, frozenset())
    return value


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``"a.b.c=value"`` into (["a", "b", "c"], value), the value parsed as YAML (``1e-5``, ``true``, ``[1, 2]``).

    A scalar that is not valid YAML on its own (``operators=*``, ``name=@x``) is taken as the plain string.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key.sub=value")
    try:
        value = load_yaml(raw, f"override {text[:80]!r}") if raw.strip() else ""
    except yaml.YAMLError as error:
        if raw.lstrip().startswith(("[", "{")):
            problem = str(error).splitlines()[0]
            raise ConfigError(f"override {text!r}: the value is not valid YAML ({problem})") from None
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each dotted override in (a copy of) the nested dict ``data``."""
    result = _deep_copy(data)
    for override in overrides:
        path, value = parse_override(override)
        node = result
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {override!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return result


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def from_dict(schema: type[T], data: dict[str, Any] | None, path: str = "") -> T:
    """Build dataclass ``schema`` from a nested dict, checking keys and types; missing keys keep defaults."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}  # type: ignore[arg-type]
    hints = typing.get_type_hints(schema)
    unknown = [key for key in data if key not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, list(fields), n=3)
        hint = f"; did you mean {close}?" if close else f"; valid keys: {sorted(fields)}"
        raise ConfigError(f"unknown key {_join(path, key)!r}{hint}")
    values = {key: _convert(hints[key], value, _join(path, key)) for key, value in data.items()}
    try:
        instance = schema(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path or 'config'}: {exc}") from None
    return instance


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(annotation: Any, value: Any, path: str) -> Any:
    origin, args = get_origin(annotation), get_args(annotation)
    if dataclasses.is_dataclass(annotation):
        return from_dict(annotation, value, path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} matches none of {args}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: {value!r} is not one of {list(args)}")
        return value
    if annotation is Any:
        return value
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    if origin is list or annotation is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return value
    return value


def to_dict(config: Any) -> dict[str, Any]:
    """The config as a plain nested dict (for saving next to a run's outputs)."""
    return dataclasses.asdict(config)


def load_config(schema: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Read YAML ``path`` (or start from defaults), apply dotted ``overrides``, and build ``schema``."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = load_yaml(path.read_text(), str(path)) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return from_dict(schema, apply_overrides(data, overrides or []))
