"""TorchTrainer: policy-gradient (or SFT) steps on a transformers causal LM with plain PyTorch.

One process, CPU or one GPU. ``train_step(batch)`` splits the batch into micro-batches
(padded or packed), accumulates gradients with loss denominators taken over the whole
batch (so accumulation changes nothing but memory), clips the gradient norm, steps AdamW
and the LR schedule, and returns metrics. On a GPU the forward runs under bf16 autocast
with fp32 master weights. ``push_weights(version)`` hands the weights to generators
through a ``WeightStore``; ``save``/``load`` checkpoint model, optimizer, schedule, step
and RNG state. With ``config.lora`` only a LoRA adapter trains (``forge_env.rl.lora``): pushes and
checkpoints then hold the adapter alone.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from forge_env.rl import lora
from forge_env.rl.batching import collate, split_micro_batches
from forge_env.rl.device import Precision, autocast, resolve_device, resolve_precision
from forge_env.rl.logprobs import batch_logprobs, model_token_logprobs
from forge_env.rl.losses import LossFn, LossOutput, get_loss, sft_loss
from forge_env.rl.off_policy import OffPolicyConfig, with_off_policy_correction
from forge_env.rl.trainer_state import (
    PLAIN_FILE,
    TENSORS_FILE,
    has_trainer_state,
    load_trainer_state,
    save_trainer_state,
)
from forge_env.rl.types import TrainSample
from forge_env.weights.adapter import LoRAConfig
from forge_env.weights.backend import WeightsInfo
from forge_env.weights.store import WeightStore

LRSchedule = Literal["constant", "linear", "cosine"]


@dataclass
class TrainerConfig:
    """Optimisation and batching settings shared by the trainers."""

    loss: str = "grpo"
    """A name from ``forge_env.rl.losses.LOSSES``."""
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the loss (clip_low, clip_high, kl_coef, aggregation, horizon, ...)."""
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    """Truncated/masked importance sampling against the sampler's logprobs (``forge_env.rl.off_policy``);
    off by default. The trainer-vs-sampler mismatch metrics are reported either way; ``sft`` ignores it."""
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    lr_schedule: LRSchedule = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    """Length of the linear/cosine decay (required for them)."""
    min_lr_ratio: float = 0.0
    micro_batch_size: int = 8
    max_tokens_per_micro_batch: int | None = None
    packing: bool = False
    """Pack each micro-batch into one row (no pad compute) instead of right-padding."""
    share_prefix: bool = False
    """Run the leading tokens that every sample of a (padded) micro-batch shares once instead of once per sample
    (``forge_env.rl.logprobs.shared_prefix_logits``): a system prompt or a group's prompt. Same loss and
    gradients up to float rounding; needs a model with a transformers KV cache; off with ``packing`` or
    ``gradient_checkpointing``."""
    temperature: float = 1.0
    """Sampling temperature the generator used: logits are divided by it so logprobs match the sampler's."""
    compute_entropy: bool = True
    device: str = "auto"
    precision: Precision = "auto"
    pad_token_id: int | None = None
    """Token used for right-padding (never scored); defaults to the model's pad/eos id or 0."""
    seed: int = 0
    gradient_checkpointing: bool = False
    lora: LoRAConfig | None = None
    """Train a LoRA adapter (rank, alpha, target_modules, dropout) through PEFT instead of every weight; None:
    full fine-tuning. ``TitanTrainer`` refuses it (``ConfigError``)."""

    def __post_init__(self) -> None:
        get_loss(self.loss)
        self.lora = LoRAConfig.coerce(self.lora)
        self.off_policy = OffPolicyConfig.coerce(self.off_policy)
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; choose constant, linear or cosine")
        if self.lr_schedule != "constant" and not self.total_steps:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} needs total_steps")
        if self.micro_batch_size < 1:
            raise ValueError("micro_batch_size must be >= 1")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")


def lr_lambda(config: TrainerConfig) -> Callable[[int], float]:
    """Multiplier of the base LR at each step: linear warmup, then constant/linear/cosine decay."""

    def factor(step: int) -> float:
        if config.warmup_steps and step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.lr_schedule == "constant":
            return 1.0
        assert config.total_steps is not None
        span = max(config.total_steps - config.warmup_steps, 1)
        progress = min(max(step - config.warmup_steps, 0) / span, 1.0)
        if config.lr_schedule == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * decay

    return factor


def load_causal_lm(model: torch.nn.Module | str | os.PathLike) -> torch.nn.Module:
    """``model`` itself, or a transformers causal LM loaded from a local path / hub id / known model id (fp32)."""
    if isinstance(model, torch.nn.Module):
        return model
    from transformers import AutoModelForCausalLM

    from forge_env.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32)


def default_pad_token_id(model: torch.nn.Module) -> int:
    config = getattr(model, "config", None)
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(config, attr, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int):
            return value
    return 0


def flatten_batch(batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> list[TrainSample]:
    """Accept a flat batch or the dp-sharded one ``ReplayBuffer.sample`` returns for ``dp_size > 1``."""
    flat: list[TrainSample] = []
    for item in batch:
        if isinstance(item, TrainSample):
            flat.append(item)
        elif isinstance(item, (list, tuple)):
            flat.extend(flatten_batch(item))
        else:
            raise TypeError(f"a training batch holds TrainSample objects, got {type(item).__name__}")
    return flat


def combine_metrics(parts: list[tuple[dict[str, float], float]]) -> dict[str, float]:
    """Merge per-micro-batch loss metrics: losses add up (global denominators), extremes stay
    extremes, everything else is averaged weighted by sampled tokens."""
    out: dict[str, float] = {}
    total_weight = sum(w for _, w in parts) or 1.0
    keys = {k for m, _ in parts for k in m}
    for key in keys:
        values = [(m[key], w) for m, w in parts if key in m]
        if key in ("loss", "pg_loss"):
            out[key] = sum(v for v, _ in values)
        elif key.endswith("_min"):
            out[key] = min(v for v, _ in values)
        elif key.endswith("_max"):
            out[key] = max(v for v, _ in values)
        else:
            weight = sum(w for _, w in values) or total_weight
            out[key] = sum(v * w for v, w in values) / weight
    return out


def corrected_loss(loss_fn: LossFn, config: TrainerConfig) -> LossFn:
    """``loss_fn`` with ``config.off_policy``'s correction and mismatch metrics (SFT has no sampler: as is)."""
    if loss_fn is sft_loss or config.loss == "sft":
        return loss_fn
    return with_off_policy_correction(loss_fn, config.off_policy)


def check_reference(loss_fn: Any, loss_kwargs: dict[str, Any], samples: Sequence[TrainSample]) -> None:
    """Raise if the loss has a KL term (``kl_coef``, from ``loss_kwargs`` or the loss's default) but a sample has
    no ``ref_logprobs``. Every trainer (``TorchTrainer``, ``TitanTrainer``) checks its batch with it."""
    param = inspect.signature(loss_fn).parameters.get("kl_coef")
    kl_coef = loss_kwargs.get("kl_coef", param.default if param is not None else 0.0)
    if kl_coef and any(s.ref_logprobs is None for s in samples):
        raise ValueError(
            f"the loss has kl_coef={kl_coef} but some samples have no ref_logprobs; "
            "fill them with ReferenceModel.annotate(batch), or set loss_kwargs={'kl_coef': 0.0}"
        )


class TorchTrainer:
    """Trains a transformers causal LM on ``TrainSample`` batches (see the module docstring); a ``Trainer``."""

    def __init__(
        self,
        model: torch.nn.Module | str | os.PathLike,
        config: TrainerConfig | None = None,
        *,
        weight_store: WeightStore | None = None,
        loss_fn: LossFn | None = None,
        **overrides: Any,
    ) -> None:
        config = TrainerConfig(**overrides) if config is None else dataclasses.replace(config, **overrides)
        self.config = config
        self.loss_fn = corrected_loss(loss_fn or get_loss(config.loss), config)
        self.weight_store = weight_store
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        self.precision = resolve_precision(config.precision, self.device)
        self.model = load_causal_lm(model).to(self.device, dtype=torch.float32)
        if config.lora is not None:
            self.model = lora.apply_lora(self.model, config.lora)
        elif lora.is_lora_model(self.model):
            raise ValueError("the model carries a LoRA adapter (a PEFT model) but this TrainerConfig has no lora; "
                             "set lora to the adapter's config so pushes and checkpoints hold the adapter")
        self.model.train()
        if config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if config.lora is not None:  # frozen embeddings: checkpointed blocks still need an input grad
                self.model.enable_input_require_grads()
        self.pad_token_id = config.pad_token_id if config.pad_token_id is not None else default_pad_token_id(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config))
        self.step = 0
        self.policy_version = 0  # the version last published by push_weights
        self.pushed_bytes = 0  # bytes of every push so far (the adapter alone with LoRA)

    # ----------------------------------------------------------------- training

    def train_step(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> dict[str, float]:
        """One optimizer step on ``batch``; returns the loss metrics plus grad_norm, lr, step, token counts."""
        samples = flatten_batch(batch)
        if not samples:
            raise ValueError("train_step got an empty batch; ReplayBuffer.sample returns None when it cannot fill one")
        self._check_reference(samples)
        cfg = self.config
        num_tokens = float(sum(s.num_loss_tokens for s in samples))
        num_seqs = float(len(samples))
        if num_tokens == 0:
            raise ValueError("no sampled tokens in the batch (every loss_mask is 0); nothing to train on")

        parts: list[tuple[dict[str, float], float]] = []
        chunks = split_micro_batches(samples, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, packing=cfg.packing)
        for chunk in chunks:
            out = self._forward_loss(chunk, num_tokens=num_tokens, num_seqs=num_seqs)
            out.loss.backward()
            parts.append((out.metrics, float(sum(s.num_loss_tokens for s in chunk))))

        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        lr = self.optimizer.param_groups[0]["lr"]
        skipped = not math.isfinite(grad_norm)
        if not skipped:  # a non-finite gradient would poison AdamW's moments for good
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)

        metrics = combine_metrics(parts)
        metrics.update(
            grad_norm=grad_norm,
            lr=lr,
            step=float(self.step),
            skipped_step=float(skipped),
            num_samples=num_seqs,
            num_loss_tokens=num_tokens,
            num_micro_batches=float(len(chunks)),
            reward_mean=sum(s.reward for s in samples) / num_seqs,
            advantage_mean=sum(s.advantage for s in samples) / num_seqs,
        )
        return metrics

    def compute_loss(self, batch: Sequence[TrainSample]) -> LossOutput:
        """The loss of ``batch`` as one micro-batch, with gradient graph (no optimizer step)."""
        samples = flatten_batch(batch)
        self._check_reference(samples)
        return self._forward_loss(samples, num_tokens=None, num_seqs=None)

    def _forward_loss(self, chunk: list[TrainSample], *, num_tokens: float | None, num_seqs: float | None) -> LossOutput:
        cfg = self.config
        inputs, lt = collate(chunk, pad_token_id=self.pad_token_id, packing=cfg.packing, device=self.device)
        with autocast(self.device, self.precision):
            logprobs, entropy = model_token_logprobs(
                self.model, inputs, temperature=cfg.temperature, with_entropy=cfg.compute_entropy,
                share_prefix=cfg.share_prefix and not cfg.packing and not cfg.gradient_checkpointing,
            )
        return self.loss_fn(
            logprobs,
            lt.old_logprobs,
            lt.advantages,
            lt.loss_mask,
            ref_logprobs=lt.ref_logprobs,
            entropy=entropy,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            **cfg.loss_kwargs,
        )

    def _check_reference(self, samples: list[TrainSample]) -> None:
        check_reference(self.loss_fn, self.config.loss_kwargs, samples)

    @torch.no_grad()
    def logprobs(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> list[list[float]]:
        """Current policy's logprob of every token of every sample (0.0 for token 0)."""
        was_training = self.model.training
        self.model.eval()
        try:
            return batch_logprobs(
                self.model,
                flatten_batch(batch),
                micro_batch_size=self.config.micro_batch_size,
                max_tokens=self.config.max_tokens_per_micro_batch,
                packing=self.config.packing,
                pad_token_id=self.pad_token_id,
                temperature=self.config.temperature,
                autocast=autocast(self.device, self.precision),
            )
        finally:
            self.model.train(was_training)

    # ------------------------------------------------------------ weight sync

    def state_dict_for_generators(self, *, full: bool = False) -> dict[str, torch.Tensor]:
        """The model's weights under their transformers names, detached (what generators load); with LoRA
        the adapter's tensors alone, under their PEFT names, or with ``full`` the base weights alone (under
        their transformers names: a LoRA generator takes them as its new base and resets its adapter)."""
        if self.config.lora is not None:
            return lora.base_state_dict(self.model) if full else lora.adapter_state_dict(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def push_weights(self, version: int, *, full: bool = False) -> WeightsInfo:
        """Publish the current weights as ``version`` in the weight store (``full``: see
        ``state_dict_for_generators``; with LoRA, once after a full-weight warm-up changed the base)."""
        if self.weight_store is None:
            raise RuntimeError("this TorchTrainer has no weight_store; construct it with weight_store=WeightStore(...)")
        info = self.weight_store.put(self.state_dict_for_generators(full=full), version)
        self.policy_version = version
        self.pushed_bytes += info.num_bytes
        return info

    # ------------------------------------------------------------ checkpoints

    def save(self, path: str | os.PathLike) -> Path:
        """Write model weights (safetensors) and the optimizer, schedule, step and RNG states under ``path``:
        tensors in safetensors, the rest in JSON, nothing pickled (see ``forge_env.rl.trainer_state``)."""
        from safetensors.torch import save_model

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.config.lora is not None:  # the base is the model the run started from: the adapter alone
            lora.save_adapter(self.model, self.config.lora, path)
        else:
            save_model(self.model, str(path / "model.safetensors"))
        save_trainer_state(path, self.optimizer, self.scheduler, self.step, asdict(self.config))
        return path

    def load(self, path: str | os.PathLike) -> None:
        """Restore what ``save`` wrote (the model architecture must match). Reads data only: no unpickling."""
        from safetensors.torch import load_model

        path = Path(path)
        if self.config.lora is not None:
            if not has_trainer_state(path):
                raise FileNotFoundError(f"{path} is not a TorchTrainer checkpoint (no {TENSORS_FILE} + {PLAIN_FILE})")
            lora.load_adapter(self.model, self.config.lora, path, self.device)
            self.step = load_trainer_state(path, self.optimizer, self.scheduler, self.device)
            return
        if (path / lora.ADAPTER_DIR).is_dir() and not (path / "model.safetensors").exists():
            raise FileNotFoundError(f"{path} holds a LoRA adapter, not full weights: load it with trainer.lora set")
        if not (path / "model.safetensors").exists() or not has_trainer_state(path):
            raise FileNotFoundError(f"{path} is not a TorchTrainer checkpoint (model.safetensors + "
                                    f"{TENSORS_FILE} + {PLAIN_FILE})")
        load_model(self.model, str(path / "model.safetensors"), device=str(self.device))
        self.step = load_trainer_state(path, self.optimizer, self.scheduler, self.device)


