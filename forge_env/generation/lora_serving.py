"""Base + LoRA adapter in a transformers model, for ``HFGenerator`` (``HFGeneratorConfig.lora``).

The adapter's layers are injected into the model (PEFT's ``inject_adapter_in_model``: the model keeps its
class, so the generator's cache and batching code see the same module) with ``B = 0``, i.e. the base
policy, and every update replaces the adapter's tensors, given under their PEFT checkpoint names (what a
LoRA ``TorchTrainer`` pushes). Adapter updates never touch the base weights, so the forward is
``W x + s B A x``, the merged model's ``(W + s B A) x`` up to float rounding.

An update without adapter tensors is a new *base*: the model's full weights under their transformers
names (what ``TorchTrainer.push_weights(version, full=True)`` sends once after a full-weight warm-up,
``sft.full_weights``). It is checked whole, copied into the base layers, and the adapter is reset to
``B = 0``: the generator then serves exactly the pushed base until the next adapter update.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from forge_env.generation.base import WeightUpdateError
from forge_env.weights.adapter import (
    PEFT_PREFIX,
    AdapterWeightSpecs,
    LoRAConfig,
    is_adapter_name,
    load_base_weights,
)
from forge_env.weights.errors import WeightMismatchError

_ADAPTER_NAME = "default"


class LoRAServing:
    """The adapter slot of one model: ``load(update)`` checks and copies a pushed adapter into it."""

    def __init__(self, model: torch.nn.Module, lora: LoRAConfig) -> None:
        try:
            from peft import inject_adapter_in_model
        except ImportError as exc:  # pragma: no cover - peft is in the dev extra
            raise WeightUpdateError("serving a LoRA adapter needs PEFT: pip install 'forge-env[lora]'") from exc
        self.lora = lora
        self.model = model
        self.specs = AdapterWeightSpecs.for_model(model, lora)
        serving = LoRAConfig(rank=lora.rank, alpha=lora.alpha, target_modules=lora.target_modules, dropout=0.0)
        inject_adapter_in_model(serving.to_peft(), model, adapter_name=_ADAPTER_NAME)
        model.requires_grad_(False)
        self._params = {name: param for name, param in model.named_parameters() if ".lora_" in name}
        targets = {self._module_name(name) for name in self.specs.specs}
        if targets != set(self._params):  # PEFT matched other modules than the spec: never serve a guess
            raise WeightUpdateError(f"PEFT injected {sorted(set(self._params) - targets)[:5]} / missed "
                                    f"{sorted(targets - set(self._params))[:5]} of the adapter's tensors")
        self._zero_adapter()  # the base model until the first update

    def _zero_adapter(self) -> None:
        for name, param in self._params.items():
            if ".lora_B." in name:
                param.data.zero_()

    @staticmethod
    def _module_name(peft_name: str) -> str:
        """``base_model.model.X.lora_A.weight`` -> ``X.lora_A.default.weight`` (the injected parameter)."""
        inner = peft_name[len(PEFT_PREFIX):] if peft_name.startswith(PEFT_PREFIX) else peft_name
        head, _, leaf = inner.rpartition(".")
        return f"{head}.{_ADAPTER_NAME}.{leaf}"

    def load(self, update: Mapping[str, torch.Tensor], what: str) -> None:
        """Copy the adapter ``update`` (PEFT names) in, or, for an update without adapter tensors, the new
        base weights (transformers names; the adapter is reset to zero); refused whole, before any copy,
        if it does not fit."""
        try:
            if update and not any(is_adapter_name(n) for n in update):
                load_base_weights(self.model, update, f"{what} (full weights: a new base)")
                self._zero_adapter()
                return
            self.specs.check(update, what)
        except WeightMismatchError as exc:
            raise WeightUpdateError(str(exc)) from exc
        with torch.no_grad():
            for name, tensor in update.items():
                param = self._params[self._module_name(name)]
                param.copy_(tensor.to(device=param.device, dtype=param.dtype))
