"""LoRA adapters as the unit of a weight update: their config, their tensor names, and their spec.

A trainer that trains a LoRA adapter (``TrainerConfig.lora``) pushes only the adapter's tensors, named as
PEFT saves them (``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``), so the same bytes are a
PEFT adapter file that vLLM can load. A generator configured with the same ``LoRAConfig`` checks an
update against :class:`AdapterWeightSpecs` (every adapter tensor, no other name, the right shapes) before
anything is loaded, the way ``ModelWeightSpecs`` checks full updates.

``LoRAConfig`` and the name helpers import without torch; PEFT is imported only where an adapter is built.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_env.config import ConfigError
from forge_env.weights.errors import WeightMismatchError

#: The PEFT checkpoint prefix of a causal LM's modules (``PeftModelForCausalLM.base_model.model``).
PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_SHOW = 5


@dataclass
class LoRAConfig:
    """A LoRA adapter on a causal LM's linear layers: ``W x + (alpha / rank) B A x``.

    ``target_modules`` are module names matched as PEFT matches them (the last components of a module's
    dotted name, e.g. ``q_proj`` or ``self_attn.q_proj``); every one must match at least one linear layer.
    ``dropout`` applies to the adapter's input while training only.
    """

    rank: int = 16
    alpha: float = 32.0
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"lora.rank must be an integer >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.target_modules, str):
            raise ConfigError(f"lora.target_modules is a list of module names, got the string {self.target_modules!r}")
        targets = list(self.target_modules)
        if not targets or not all(isinstance(t, str) and t.strip() for t in targets):
            raise ConfigError(f"lora.target_modules must be a non-empty list of module names, got {targets!r}")
        self.target_modules = targets
        self.alpha = float(self.alpha)

    @classmethod
    def coerce(cls, value: LoRAConfig | Mapping[str, Any] | None) -> LoRAConfig | None:
        """``value`` as a ``LoRAConfig`` (a mapping is read strictly, with close-match hints for bad keys)."""
        if value is None or isinstance(value, LoRAConfig):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"lora must be a mapping of rank/alpha/target_modules/dropout, got {value!r}")
        from forge_env.config import from_dict

        return from_dict(cls, dict(value), "lora")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_peft(self) -> Any:
        """The equivalent ``peft.LoraConfig`` (a causal-LM task, bias untouched)."""
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), bias="none", task_type="CAUSAL_LM")

    def adapter_config_json(self, base_model: str | None = None) -> dict[str, Any]:
        """``adapter_config.json`` of an adapter trained with this config (what PEFT and vLLM read)."""
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
                "lora_dropout": self.dropout, "target_modules": list(self.target_modules), "bias": "none",
                "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None,
                "base_model_name_or_path": base_model, "inference_mode": True}


def is_adapter_name(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def base_weight_name(name: str) -> str | None:
    """The transformers name of a base weight in a model carrying an adapter (a PEFT model, or one with
    injected adapter layers): ``base_model.model.X.q_proj.base_layer.weight`` -> ``X.q_proj.weight``;
    None for the adapter's own tensors."""
    if ".lora_" in name:
        return None
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):]
    return name.replace(".base_layer.", ".")


def matches_target(module_name: str, targets: Iterable[str]) -> bool:
    """PEFT's rule: a target matches a module whose dotted name is the target or ends with ``.target``."""
    return any(module_name == t or module_name.endswith("." + t) for t in targets)


def check_targets(linear_names: Iterable[str], lora: LoRAConfig) -> None:
    """``ConfigError`` naming each target that matches no linear layer, with the closest layer names."""
    names = list(linear_names)
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    for target in lora.target_modules:
        if not any(matches_target(n, [target]) for n in names):
            close = difflib.get_close_matches(target.rsplit(".", 1)[-1], leaves, n=3)
            hint = f"; did you mean {close}?" if close else f"; the model's linear layers: {leaves}"
            raise ConfigError(f"lora.target_modules: {target!r} matches no linear layer of the model{hint}")


@dataclass(frozen=True)
class AdapterWeightSpecs:
    """The tensors of a ``LoRAConfig`` adapter on one model (PEFT checkpoint names -> ``TensorSpec``)."""

    specs: Mapping[str, Any]

    @classmethod
    def for_model(cls, model: Any, lora: LoRAConfig) -> AdapterWeightSpecs:
        """The adapter's specs on ``model`` (a transformers model; the meta device is enough)."""
        import torch

        from forge_env.weights.safetensors_io import TensorSpec

        linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        check_targets(linears, lora)
        specs: dict[str, TensorSpec] = {}
        for name, module in linears.items():
            if not matches_target(name, lora.target_modules):
                continue
            specs[f"{PEFT_PREFIX}{name}.lora_A.weight"] = TensorSpec(torch.float32, (lora.rank, module.in_features))
            specs[f"{PEFT_PREFIX}{name}.lora_B.weight"] = TensorSpec(torch.float32, (module.out_features, lora.rank))
        return cls(specs)

    @classmethod
    def from_pretrained(cls, model: str | Path, lora: LoRAConfig) -> AdapterWeightSpecs:
        """The specs on the checkpoint at ``model``, from its config alone (a meta-device model)."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model)))
        return cls.for_model(meta, lora)

    @property
    def num_bytes(self) -> int:
        """The adapter's size in float32."""
        total = 0
        for spec in self.specs.values():
            count = 1
            for dim in spec.shape:
                count *= dim
            total += 4 * count
        return total

    def check(self, update: Mapping[str, Any], what: str) -> None:
        """Raise ``WeightMismatchError`` unless ``update`` (name -> tensor or ``TensorSpec``) is this adapter."""
        import torch

        missing = sorted(set(self.specs) - set(update))
        unexpected = sorted(set(update) - set(self.specs))
        problems = []
        if unexpected and not any(is_adapter_name(n) for n in update):
            problems.append(f"it holds no LoRA tensors ({len(update)} others, e.g. {unexpected[:3]}): a full "
                            "update sent to a generator that serves a LoRA adapter")
        else:
            if missing:
                problems.append(f"missing {len(missing)} adapter tensors {missing[:_SHOW]}")
            if unexpected:
                problems.append(f"{len(unexpected)} unknown names {unexpected[:_SHOW]}")
        shapes = [f"{n}: {list(update[n].shape)} (adapter: {list(s.shape)})"
                  for n, s in self.specs.items() if n in update and tuple(update[n].shape) != s.shape]
        if shapes:
            problems.append(f"{len(shapes)} wrong shapes (another rank?): {'; '.join(shapes[:_SHOW])}")
        dtypes = [f"{n}: {t.dtype}" for n, t in update.items()
                  if n in self.specs and t.dtype not in (torch.float32, torch.bfloat16, torch.float16)]
        if dtypes:
            problems.append(f"{len(dtypes)} tensors not float32/bfloat16/float16: {'; '.join(dtypes[:_SHOW])}")
        if problems:
            raise WeightMismatchError(f"{what} is not the configured LoRA adapter: {', '.join(problems)}")


def write_adapter_dir(path: str | Path, tensors: Mapping[str, Any], lora: LoRAConfig,
                      base_model: str | None = None) -> Path:
    """Write ``tensors`` (PEFT names) and ``lora``'s ``adapter_config.json`` as a PEFT adapter directory."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path / ADAPTER_WEIGHTS_FILE))
    (path / ADAPTER_CONFIG_FILE).write_text(json.dumps(lora.adapter_config_json(base_model), indent=1))
    return path


def read_adapter_config(path: str | Path) -> LoRAConfig:
    """The ``LoRAConfig`` of a PEFT adapter directory (rank, alpha, targets, dropout)."""
    raw = json.loads((Path(path) / ADAPTER_CONFIG_FILE).read_text())
    if raw.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{path}: not a LoRA adapter (peft_type {raw.get('peft_type')!r})")
    targets = raw.get("target_modules")
    if isinstance(targets, str):
        raise ConfigError(f"{path}: target_modules {targets!r} is a pattern; name the modules")
    return LoRAConfig(rank=int(raw["r"]), alpha=float(raw["lora_alpha"]), target_modules=list(targets or []),
                      dropout=float(raw.get("lora_dropout", 0.0)))


def base_state_dict(model: Any) -> dict[str, Any]:
    """The base weights of ``model`` (which may carry adapter layers) under their transformers names, detached."""
    out = {}
    for name, tensor in model.state_dict().items():
        plain = base_weight_name(name)
        if plain is not None:
            out[plain] = tensor.detach()
    return out


def load_base_weights(model: Any, update: Mapping[str, Any], what: str) -> None:
    """Copy a full state dict (transformers names) into the base weights of ``model``, which may carry
    adapter layers (the adapter is left as it is). Checked whole before anything is copied: every base
    weight given (a tied LM head may be left out), no other name, the same shapes; else
    ``WeightMismatchError``."""
    import torch

    targets = {plain: tensor for name, tensor in model.state_dict().items()
               if (plain := base_weight_name(name)) is not None}
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    missing = sorted(n for n in set(targets) - set(update) if not (tied and n.endswith("lm_head.weight")))
    unexpected = sorted(set(update) - set(targets))
    shapes = [f"{n}: {list(update[n].shape)} (model: {list(t.shape)})"
              for n, t in targets.items() if n in update and tuple(update[n].shape) != tuple(t.shape)]
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} base weights {missing[:_SHOW]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unknown names {unexpected[:_SHOW]}")
    if shapes:
        problems.append(f"{len(shapes)} wrong shapes: {'; '.join(shapes[:_SHOW])}")
    if problems:
        raise WeightMismatchError(f"{what} is not this model's full set of base weights: {', '.join(problems)}")
    with torch.no_grad():
        for name, tensor in update.items():
            target = targets[name]
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
