"""LoRA on the trainer's model through PEFT: wrap, read and load the adapter, save it as a PEFT directory.

``TrainerConfig.lora`` (a ``forge_env.weights.adapter.LoRAConfig``) makes ``TorchTrainer`` train only a
LoRA adapter: the base weights are frozen, the optimizer holds the adapter's parameters alone, pushes send
the adapter alone (PEFT checkpoint names) and checkpoints hold the adapter alone (``adapter/``, a PEFT
adapter directory that ``peft.PeftModel.from_pretrained`` and vLLM also read).

After a full-weight warm-up (``sft.full_weights``) the base is no longer the model the run started from:
:func:`strip_adapter` gives the warm-up a plain model to train, :func:`save_base` / :func:`load_base` keep
the warmed-up base once (``model.safetensors``, transformers names) for resumed runs, and
``TorchTrainer.push_weights(version, full=True)`` sends it to the generators once.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from forge_env.config import ConfigError
from forge_env.weights.adapter import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    LoRAConfig,
    base_state_dict,
    check_targets,
    load_base_weights,
    read_adapter_config,
    write_adapter_dir,
)
from forge_env.weights.errors import WeightMismatchError

ADAPTER_DIR = "adapter"
BASE_WEIGHTS_FILE = "model.safetensors"


def is_lora_model(model: Any) -> bool:
    """Whether ``model`` is a PEFT model (its trainable weights are an adapter)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - peft is in the dev extra
        raise ConfigError("trainer.lora needs PEFT: pip install 'forge-env[lora]' (peft)") from exc
    return peft


def apply_lora(model: torch.nn.Module, lora: LoRAConfig) -> torch.nn.Module:
    """``model`` with a fresh LoRA adapter (B = 0: the policy is unchanged), base weights frozen.

    A model that already is a PEFT model (e.g. the RL trainer's, handed to the SFT warm-up) is used as it is
    when its adapter has the same rank, alpha and targets; another adapter is a ``ConfigError``.
    """
    peft = _peft()
    if is_lora_model(model):
        existing = model.peft_config["default"]
        same = (existing.r == lora.rank and float(existing.lora_alpha) == lora.alpha
                and set(existing.target_modules) == set(lora.target_modules))
        if not same:
            raise ConfigError(f"the model already carries a LoRA adapter (rank {existing.r}, alpha "
                              f"{existing.lora_alpha}, targets {sorted(existing.target_modules)}) that is not "
                              f"trainer.lora {lora}")
        return model
    check_targets([n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)], lora)
    return peft.get_peft_model(model, lora.to_peft())


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under their PEFT checkpoint names (``base_model.model.<module>.lora_A.weight``)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy adapter tensors (PEFT names) into ``model``'s adapter; every adapter tensor must be given."""
    from peft import set_peft_model_state_dict

    expected = set(adapter_state_dict(model))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ConfigError(f"{where} does not fit this trainer's LoRA adapter: missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]}")
    set_peft_model_state_dict(model, state)


def base_model_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the base model under ``model``'s adapter, without the adapter (not merged into it)."""
    if not is_lora_model(model):
        return copy.deepcopy(model)
    return copy.deepcopy(model).unload()


def merged_model_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of ``model`` with its adapter merged into the base weights (what the adapter serves)."""
    if not is_lora_model(model):
        return copy.deepcopy(model)
    return copy.deepcopy(model).merge_and_unload()


def save_adapter(model: torch.nn.Module, lora: LoRAConfig, path: Path) -> Path:
    """Write the adapter as a PEFT adapter directory ``path / adapter``."""
    base = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    return write_adapter_dir(path / ADAPTER_DIR, adapter_state_dict(model), lora, base)


def load_adapter(model: torch.nn.Module, lora: LoRAConfig, path: Path, device: torch.device) -> None:
    """Load ``path / adapter`` (written by :func:`save_adapter`) into ``model``; its config must be ``lora``'s."""
    from safetensors.torch import load_file

    adapter = path / ADAPTER_DIR
    if not (adapter / ADAPTER_WEIGHTS_FILE).exists() or not (adapter / ADAPTER_CONFIG_FILE).exists():
        raise FileNotFoundError(f"{path} holds no LoRA adapter ({ADAPTER_DIR}/{ADAPTER_WEIGHTS_FILE} + "
                                f"{ADAPTER_CONFIG_FILE}); was it saved by a trainer without trainer.lora?")
    saved = read_adapter_config(adapter)
    if (saved.rank, saved.alpha, set(saved.target_modules)) != (lora.rank, lora.alpha, set(lora.target_modules)):
        raise ConfigError(f"{adapter} is an adapter of rank {saved.rank}, alpha {saved.alpha}, targets "
                          f"{saved.target_modules}; trainer.lora is rank {lora.rank}, alpha {lora.alpha}, "
                          f"targets {lora.target_modules}")
    load_adapter_state(model, load_file(str(adapter / ADAPTER_WEIGHTS_FILE), device=str(device)), str(adapter))


def strip_adapter(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s base, in place, without its adapter (not merged) and with every weight trainable again:
    the plain model a full-weight warm-up trains. A model without an adapter is returned as it is."""
    if is_lora_model(model):
        model = model.unload()
    return model.requires_grad_(True)


def save_base(model: torch.nn.Module, path: Path) -> Path:
    """Write ``model``'s base weights (transformers names, a tied LM head once) as ``path / model.safetensors``."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors = {}
    for name, tensor in base_state_dict(model).items():
        if tensor.data_ptr() in seen:  # tied weights: safetensors refuses shared storage
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.cpu().contiguous()
    save_file(tensors, str(path / BASE_WEIGHTS_FILE))
    return path


def load_base(model: torch.nn.Module, path: Path) -> None:
    """Copy the base weights :func:`save_base` wrote into ``model``'s base (its adapter is left as it is)."""
    from safetensors.torch import load_file

    file = path / BASE_WEIGHTS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} holds no base weights ({BASE_WEIGHTS_FILE})")
    try:
        load_base_weights(model, load_file(str(file)), str(file))
    except WeightMismatchError as exc:
        raise ConfigError(f"{exc} (another model.path?)") from exc
