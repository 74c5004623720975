"""GGUF -> a standard Hugging Face checkpoint directory, once, atomically.

:func:`convert_gguf` reads a local GGUF file of an architecture transformers can read (llama, qwen2, qwen3,
mistral, gemma…; ``transformers.modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES``) with transformers'
own GGUF loader (which needs the ``gguf`` package) and writes what every other part of forge-env loads:

* ``model.safetensors``: the dequantized weights exactly, in float32 (transformers dequantizes to float32; the
  weights are not re-rounded to bfloat16, which changes the model's top-1 token on some positions);
* ``config.json`` without the GGUF ``quantization_config`` (the directory is a plain checkpoint);
* ``tokenizer.json`` and ``tokenizer_config.json``, and the model's own chat template, unchanged
  (``chat_template.jinja``; checked against the GGUF's ``tokenizer.chat_template`` metadata);
* ``forge_env_model.json``: where it came from (file, size, package versions).

The directory is built under a temporary name beside its destination and renamed into place, so a crash or a
concurrent build never leaves a half-written checkpoint where a loader would find it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: The manifest a converted checkpoint carries; its presence marks a complete build.
MANIFEST = "forge_env_model.json"
_GGUF_MAGIC = b"GGUF"


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded from the given path or hub id."""


class ModelConversionError(ModelLoadError):
    """A model file could not be turned into a checkpoint directory (the message names the fix)."""


def is_gguf_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _GGUF_MAGIC
    except OSError:
        return False


def is_hf_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a Hugging Face checkpoint's ``config.json``."""
    return (Path(path) / "config.json").is_file()


def require_gguf_package() -> None:
    """Raise :class:`ModelConversionError` naming the fix when the ``gguf`` package is missing or too old."""
    from transformers.utils.import_utils import GGUF_MIN_VERSION, is_gguf_available

    if not is_gguf_available():
        raise ModelConversionError(
            f"reading a GGUF file needs the `gguf` package (>= {GGUF_MIN_VERSION}): `pip install gguf` "
            f"(`make install` installs it)")


def gguf_metadata(path: str | os.PathLike, *keys: str) -> dict[str, Any]:
    """String/number fields of a GGUF file's metadata (``general.architecture``, ``tokenizer.chat_template``…)."""
    require_gguf_package()
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key in keys:
        field = reader.fields.get(key)
        if field is not None:
            out[key] = field.contents()
    return out


def convert_gguf(gguf_file: str | os.PathLike, out_dir: str | os.PathLike, *, source: dict[str, Any] | None = None
                 ) -> Path:
    """Write the HF checkpoint of ``gguf_file`` to ``out_dir`` (which must not exist yet) and return it.

    ``source`` adds fields to the manifest (e.g. the package the file came from). Raises
    :class:`ModelConversionError` for a file that is not GGUF, an architecture transformers cannot read, or a
    missing ``gguf`` package.
    """
    gguf_file, out_dir = Path(gguf_file).resolve(), Path(out_dir)
    if not gguf_file.is_file():
        raise ModelConversionError(f"{gguf_file}: no such file")
    if not is_gguf_file(gguf_file):
        raise ModelConversionError(
            f"{gguf_file} is not a GGUF file (no GGUF magic bytes); pass a .gguf file or a Hugging Face "
            f"checkpoint directory (with config.json)")
    require_gguf_package()
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    meta = gguf_metadata(gguf_file, "general.architecture", "tokenizer.chat_template", "general.name")
    architecture = str(meta.get("general.architecture", "?"))
    readable = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})  # mapping keys, not models
    # transformers also maps spellings such as "qwen2moe" and "gpt-oss" onto a name it reads
    if not any(architecture == a or a.replace("_", "") in architecture.replace("-", "") for a in readable):
        raise ModelConversionError(_unsupported(gguf_file, architecture, readable))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():
        raise ModelConversionError(f"{out_dir} exists already; remove it to convert again")
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        _write_checkpoint(gguf_file, staging, meta, source or {})
        try:
            os.rename(staging, out_dir)
        except OSError:
            if not (out_dir / MANIFEST).is_file():  # not a concurrent build that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _write_checkpoint(gguf_file: Path, out: Path, meta: dict[str, Any], source: dict[str, Any]) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as exc:
        if "not supported" in str(exc):
            raise ModelConversionError(_unsupported(gguf_file, str(meta.get("general.architecture")), [])) from exc
        raise ModelConversionError(f"{gguf_file.name}: transformers could not read it: {exc}") from exc
    template = meta.get("tokenizer.chat_template")
    if template is not None and tokenizer.chat_template != template:
        raise ModelConversionError(f"{gguf_file.name}: the tokenizer's chat template differs from the file's")
    # A plain checkpoint: the weights are already dequantized, so no GGUF quantizer is attached on load.
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    model.config.name_or_path = str(meta.get("general.name") or gguf_file.stem)
    bad = sorted({str(p.dtype) for p in model.state_dict().values() if p.dtype != torch.float32})
    if bad:
        raise ModelConversionError(f"{gguf_file.name}: dequantized to {bad}, not float32")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    manifest = {"format": "forge-env-model/1", "gguf_file": str(gguf_file), "gguf_bytes": gguf_file.stat().st_size,
                "architecture": meta.get("general.architecture"), "dtype": "float32",
                "transformers": transformers.__version__, "gguf": dist_version("gguf"), **source}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _unsupported(gguf_file: Path, architecture: str, readable: list[str]) -> str:
    listed = f" (it reads {', '.join(readable)})" if readable else ""
    return (f"{gguf_file.name}: GGUF architecture {architecture!r} cannot be read by transformers{listed}; convert "
            f"the original checkpoint instead, or upgrade transformers if a newer one reads it")


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or ``None``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
