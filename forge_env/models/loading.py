"""Loading a causal LM and its tokenizer the same way for the tiny model and real checkpoints.

Every path goes through :func:`forge_env.models.registry.resolve_model` first, so a known model id
(``smollm2-135m-instruct``) or a local ``.gguf`` file loads like a checkpoint directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge_env.models.convert import ModelLoadError
from forge_env.models.registry import resolve_model
from forge_env.models.tiny import TINY_MODEL_ID, build_tiny_model
from forge_env.models.tokenizer import build_byte_tokenizer


def load_tokenizer(path_or_hub_id: str | Path):
    """The tokenizer of a checkpoint (``TINY_MODEL_ID`` builds the byte tokenizer; a model id is pulled)."""
    if str(path_or_hub_id) == TINY_MODEL_ID:
        return build_byte_tokenizer()
    from transformers import AutoTokenizer

    path_or_hub_id = resolve_model(path_or_hub_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path_or_hub_id), **_local_only(path_or_hub_id))
    except OSError as exc:
        raise ModelLoadError(_hint(path_or_hub_id, exc)) from exc
    if tokenizer.chat_template is None:
        raise ModelLoadError(f"{path_or_hub_id}: the tokenizer has no chat template; use an instruct/chat checkpoint")
    return tokenizer


def load_model_and_tokenizer(
    path_or_hub_id: str | Path,
    *,
    dtype: Any = None,
    device: str | None = None,
    seed: int = 0,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local checkpoint directory, a hub id, a known model id
    (``forge-env models list``), a local ``.gguf`` file, or ``TINY_MODEL_ID``.

    The tiny model and a real checkpoint (say a local ``Qwen/Qwen3-1.7B`` directory) come back as the same
    kinds of objects: a ``transformers`` causal LM in eval mode and a fast tokenizer with a chat template.
    ``TINY_MODEL_ID`` builds fresh random weights from ``seed`` without touching the disk; a saved tiny
    model (``save_tiny_model``) loads through the ordinary checkpoint path. ``dtype`` defaults to float32
    on CPU and to the checkpoint's own dtype on GPUs.
    """
    import torch

    if str(path_or_hub_id) == TINY_MODEL_ID:
        model = build_tiny_model(seed)
        tokenizer = build_byte_tokenizer()
    else:
        from transformers import AutoModelForCausalLM

        path_or_hub_id = resolve_model(path_or_hub_id)
        tokenizer = load_tokenizer(path_or_hub_id)
        if dtype is None:
            dtype = torch.float32 if device in (None, "cpu") else "auto"
        try:
            model = AutoModelForCausalLM.from_pretrained(
                str(path_or_hub_id), dtype=dtype, **_local_only(path_or_hub_id)
            )
        except OSError as exc:
            raise ModelLoadError(_hint(path_or_hub_id, exc)) from exc
    if dtype is not None and dtype != "auto":
        model = model.to(dtype=dtype)
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


def _local_only(path_or_hub_id: str | Path) -> dict[str, Any]:
    # A directory that exists is never looked up on the hub (no network surprises in tests).
    return {"local_files_only": True} if Path(path_or_hub_id).is_dir() else {}


def _hint(path_or_hub_id: str | Path, exc: Exception) -> str:
    return (
        f"could not load {path_or_hub_id!r}: {exc}. Pass a local checkpoint directory (with config.json and "
        f"tokenizer files), a known model id (`forge-env models list`), a .gguf file, a reachable hub id, or "
        f"{TINY_MODEL_ID!r} for the built-in tiny model."
    )
