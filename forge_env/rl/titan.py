"""TitanTrainer: the TorchTrainer interface on torchtitan (its model definitions, FSDP/TP, HF loading).

Runs one SPMD rank per process (launch with torchrun or one Monarch proc per device; the
usual ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` variables, defaulted for a single process).
The same class runs on GPUs and on the CPU, choosing by what the machine has: on CUDA it
uses NCCL and torchtitan's flex attention; without a GPU it uses gloo, a block-causal SDPA
attention (flex has no CPU backward) and sum-reduced FSDP collectives (gloo has no
PREMUL_SUM); see ``forge_env.rl.titan_support``.

The model comes from torchtitan's registry (``torchtitan.models.<model_name>``, e.g.
``qwen3`` flavor ``0.6B``) or, with ``flavor="hf"``, takes the shape of the HF checkpoint
in ``hf_assets_path`` (any dense Qwen3 with ``model_name="qwen3"``, the tiny model kit's included; any HF
llama checkpoint, e.g. SmolLM2, with ``model_name="llama3"``). It is parallelised
by the model's ``parallelize_fn`` as the config asks (FSDP over ``data_parallel_shard_degree``,
tensor parallel over ``tensor_parallel_degree``) and initialised from the HF checkpoint
through the model's state-dict adapter.

Batches are always packed: every micro-batch is one row of documents with restarting
positions, which becomes a block-causal attention mask. Loss denominators are global
(all ranks, all micro-batches) and FSDP's gradient averaging is switched off, so the
summed gradient equals that of the whole batch on one device. The LR schedule is
``TorchTrainer``'s (``lr_lambda``). ``push_weights`` gathers full tensors, converts them
to HF names with the adapter and writes them to the ``WeightStore`` from rank 0, with the
same key set as ``TorchTrainer`` (a tied ``lm_head.weight`` included), so HF and vLLM
generators load them as they are.

torchtitan imports triton at import time; it is imported only when a TitanTrainer is built.

Kept whole: it is one class whose methods all work on the distributed state
its constructor builds (device mesh, parallelised model parts, optimizer, LR schedule, checkpointer), and
splitting that state across modules would hide which collective each method relies on. Its other jobs
already live apart: the config and torchtitan import checks in ``titan_config``, attention, masks and
device choice in ``titan_support``, batching, losses and the LR schedule shared with ``TorchTrainer``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from forge_env.rl.batching import collate, split_micro_batches
from forge_env.rl.logprobs import gather_token_logprobs
from forge_env.rl.losses import LossFn, get_loss
from forge_env.rl.titan_config import (  # noqa: F401  (TitanUnavailableError: re-exported for callers)
    DTYPES,
    TitanTrainerConfig,
    TitanUnavailableError,
    default_dist_env,
    import_torchtitan,
)
from forge_env.rl.titan_support import CPU_ATTENTION, block_causal_mask
from forge_env.rl.trainer import check_reference, combine_metrics, corrected_loss, flatten_batch, lr_lambda
from forge_env.rl.types import TrainSample
from forge_env.weights.backend import WeightsInfo
from forge_env.weights.store import WeightStore


class TitanTrainer:
    """``train_step`` / ``logprobs`` / ``push_weights`` / ``save`` / ``load`` on a torchtitan model; a ``Trainer``."""

    def __init__(
        self,
        config: TitanTrainerConfig | None = None,
        *,
        weight_store: WeightStore | None = None,
        loss_fn: LossFn | None = None,
        **overrides: Any,
    ) -> None:
        import_torchtitan()
        from forge_env.rl.titan_support import default_attention, model_spec, select_device

        config = TitanTrainerConfig(**overrides) if config is None else dataclasses.replace(config, **overrides)
        self.config = config
        self.loss_fn = corrected_loss(loss_fn or get_loss(config.loss), config)
        self.weight_store = weight_store
        self.step = 0
        self.policy_version = 0  # the version last published by push_weights
        # Before torchtitan's distributed helpers read its device globals.
        self.device_type = select_device(config.device)
        self.attn_backend = default_attention(self.device_type) if config.attn_backend == "auto" else config.attn_backend
        self.compute_dtype = config.mixed_precision_param
        if self.compute_dtype == "auto":
            self.compute_dtype = "bfloat16" if self.device_type == "cuda" else "float32"

        from torchtitan.components.checkpoint import CheckpointManager
        from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
        from torchtitan.config import CommConfig, DebugConfig, ParallelismConfig, TrainingConfig
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.activation_checkpoint import SelectiveAC
        from torchtitan.tools import utils as titan_utils

        added = default_dist_env()
        try:
            if self.device_type == "cuda":
                self.device = titan_utils.get_local_device()
                titan_utils.device_module.set_device(self.device)
            else:
                self.device = torch.device("cpu")
            world_size = dist_utils.init_distributed(CommConfig(), base_folder=config.dump_folder)
        finally:  # the process group is up: processes started later (engines, actors) must not inherit them
            for name in added:
                os.environ.pop(name, None)
        # torchtitan's default "spmd_types" backend needs every parameter to be a DTensor
        # already; "partial_dtensor" lets FSDP/TP make the DTensors (as its own trainers set it).
        self.parallelism = ParallelismConfig(
            data_parallel_shard_degree=config.data_parallel_shard_degree,
            data_parallel_replicate_degree=config.data_parallel_replicate_degree,
            tensor_parallel_degree=config.tensor_parallel_degree,
            spmd_backend="partial_dtensor",
        )
        dist_utils.set_spmd_backend(self.parallelism.spmd_backend)
        self.training = TrainingConfig(
            seq_len=config.seq_len,
            max_norm=config.max_grad_norm if config.max_grad_norm is not None else float("inf"),
            steps=config.total_steps or 1_000_000,
            dtype=config.param_dtype,  # type: ignore[arg-type]
            mixed_precision_param=self.compute_dtype,  # type: ignore[arg-type]
        )
        self.parallel_dims = ParallelDims.from_config(self.parallelism, world_size)
        dist_utils.set_determinism(
            self.parallel_dims, self.device, DebugConfig(seed=config.seed), distinct_seed_mesh_dims=["pp"]
        )

        self.model_spec = model_spec(config.model_name, config.flavor, self.attn_backend, config.hf_assets_path)
        self.sd_adapter = (
            self.model_spec.state_dict_adapter(self.model_spec.model, config.hf_assets_path or None)
            if self.model_spec.state_dict_adapter is not None
            else None
        )
        self.model = self._build_model(SelectiveAC.Config() if config.activation_checkpointing else None)
        self.model_parts = [self.model]

        self.optimizers = default_adamw(
            lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay
        )
        self.optimizers.implementation = "fused" if self.device_type == "cuda" else "foreach"
        self.optimizers = self.optimizers.build(model_parts=self.model_parts)
        # TorchTrainer's schedule (it holds the final LR after total_steps), not torchtitan's WSD one.
        self.lr_schedulers = LRSchedulersContainer(self.optimizers, lr_lambda(config))

        # HF weights come in through torchtitan's checkpointer and the model's state-dict adapter.
        self.checkpointer = CheckpointManager.Config(
            enable=bool(config.hf_assets_path),
            folder="checkpoint",
            initial_load_path=str(Path(config.hf_assets_path).resolve()) if config.hf_assets_path else None,
            initial_load_in_hf=bool(config.hf_assets_path),
            initial_load_model_only=True,
            load_only=True,
        ).build(
            dataloader=None,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self},
            sd_adapter=self.sd_adapter,
            base_folder=config.dump_folder,
        )
        self.checkpointer.load()
        self.train_context = dist_utils.get_spmd_context(parallel_dims=self.parallel_dims)

        batch_mesh = self.parallel_dims.get_optional_mesh("batch")
        self.dp_size = batch_mesh.size() if batch_mesh is not None else 1
        self.dp_rank = batch_mesh.get_local_rank() if batch_mesh is not None else 0
        self.rank = torch.distributed.get_rank()

    def _build_model(self, ac_config: Any) -> torch.nn.Module:
        from torch.distributed.fsdp import FSDPModule
        from torchtitan.config import CompileConfig
        from torchtitan.distributed.fsdp import disable_fsdp_gradient_division
        from torchtitan.tools import utils as titan_utils

        from forge_env.rl.titan_support import fit_seq_len

        model_config = self.model_spec.model
        model_config.update_from_config(config=self)  # reads self.parallelism
        fit_seq_len(model_config, self.config.seq_len)
        with torch.device("meta"), titan_utils.set_default_dtype(DTYPES[self.config.param_dtype]):
            model = model_config.build()
        model = self.model_spec.parallelize_fn(
            model,
            parallel_dims=self.parallel_dims,
            training=self.training,
            parallelism=self.parallelism,
            compile_config=CompileConfig(),
            ac_config=ac_config,  # None: no activation checkpointing
            dump_folder=self.config.dump_folder,
        )
        # Losses use global denominators; FSDP must sum gradients, not average them.
        disable_fsdp_gradient_division(model)
        if self.device_type == "cpu":  # gloo has no PREMUL_SUM reduce op
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)
        model.to_empty(device=self.device_type)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        return model

    # ------------------------------------------------------------- Stateful (checkpointer "train_state")

    def state_dict(self) -> dict[str, Any]:
        state = {"step": self.step, "torch_rng": torch.get_rng_state()}
        if self.device_type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"].cpu())
        if "cuda_rng" in state and self.device_type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu())

    # ----------------------------------------------------------------------- training

    def _local_shard(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> tuple[list[TrainSample], list[TrainSample]]:
        """(this rank's samples, all samples): a list of dp shards, or a flat batch split evenly."""
        if batch and all(isinstance(b, (list, tuple)) for b in batch):
            shards = [flatten_batch(b) for b in batch]  # type: ignore[arg-type]
        else:
            flat = flatten_batch(batch)
            if len(flat) % self.dp_size:
                raise ValueError(f"a flat batch of {len(flat)} samples does not split over {self.dp_size} dp ranks")
            per = len(flat) // self.dp_size
            shards = [flat[i * per : (i + 1) * per] for i in range(self.dp_size)]
        if len(shards) != self.dp_size or len({len(s) for s in shards}) != 1:
            raise ValueError(f"need {self.dp_size} shards of equal size (ranks must run the same micro-batches), "
                             f"got sizes {[len(s) for s in shards]}")
        return shards[self.dp_rank], [s for shard in shards for s in shard]

    def _forward(self, chunk: list[TrainSample], with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        inputs, lt = collate(
            chunk, pad_token_id=self._pad_token_id(), packing=True,
            pad_to_multiple=self.config.pad_to_multiple, device=self.device,
        )  # fmt: skip
        if self.attn_backend == CPU_ATTENTION:
            masks = block_causal_mask(inputs.position_ids)
        else:
            masks = self.model.get_attention_masks(inputs.position_ids)
        logits = self.model(inputs.input_ids, positions=inputs.position_ids, attention_masks=masks)
        logprobs, entropy = gather_token_logprobs(
            logits, inputs, temperature=self.config.temperature, with_entropy=with_entropy
        )
        return logprobs, entropy, lt

    def _pad_token_id(self) -> int:
        return self.config.pad_token_id if self.config.pad_token_id is not None else 0

    def train_step(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> dict[str, float]:
        """One optimizer step; every rank calls it with the same batch (or the same list of dp shards)."""
        from torchtitan.distributed import utils as dist_utils

        parts, chunks, everything = self._backward(batch)
        grad_norm = dist_utils.clip_grad_norm_(
            [p for m in self.model_parts for p in m.parameters()],
            self.training.max_norm,
            foreach=True,
            pp_mesh=None,
            ep_enabled=self.parallel_dims.ep_enabled,
        )
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        lr = float(self.lr_schedulers.schedulers[0].get_last_lr()[0])
        skipped = not math.isfinite(grad_norm)  # the same on every rank: the norm is all-reduced
        if not skipped:  # a non-finite gradient would poison AdamW's moments for good
            self.optimizers.step()
            self.lr_schedulers.step()
            self.step += 1
        self.optimizers.zero_grad()

        num_seqs = float(len(everything))
        metrics = self._reduce(combine_metrics(parts), sum(w for _, w in parts))
        metrics.update(
            grad_norm=grad_norm, lr=lr, step=float(self.step), skipped_step=float(skipped),
            num_samples=num_seqs, num_loss_tokens=float(sum(s.num_loss_tokens for s in everything)),
            num_micro_batches=float(len(chunks)),
            reward_mean=sum(s.reward for s in everything) / num_seqs,
            advantage_mean=sum(s.advantage for s in everything) / num_seqs,
        )  # fmt: skip
        return metrics

    def _backward(
        self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]
    ) -> tuple[list[tuple[dict[str, float], float]], list[list[TrainSample]], list[TrainSample]]:
        """Accumulate this rank's gradient of the whole batch's loss; (metric parts, micro-batches, all samples)."""
        local, everything = self._local_shard(batch)
        if not local:
            raise ValueError("train_step got an empty batch; ReplayBuffer.sample returns None when it cannot fill one")
        self._check_reference(everything)
        num_tokens = float(sum(s.num_loss_tokens for s in everything))
        num_seqs = float(len(everything))
        if num_tokens == 0:
            raise ValueError("no sampled tokens in the batch (every loss_mask is 0); nothing to train on")

        parts: list[tuple[dict[str, float], float]] = []
        chunks = split_micro_batches(local, self.config.micro_batch_size)
        with self.train_context():
            for chunk in chunks:
                out = self._forward_loss(chunk, num_tokens=num_tokens, num_seqs=num_seqs)
                out.loss.backward()
                parts.append((out.metrics, float(sum(s.num_loss_tokens for s in chunk))))
        return parts, chunks, everything

    def _forward_loss(self, chunk: list[TrainSample], *, num_tokens: float | None, num_seqs: float | None) -> Any:
        logprobs, entropy, lt = self._forward(chunk, self.config.compute_entropy)
        return self.loss_fn(
            logprobs, lt.old_logprobs, lt.advantages, lt.loss_mask,
            ref_logprobs=lt.ref_logprobs, entropy=entropy,
            num_tokens=num_tokens, num_seqs=num_seqs, **self.config.loss_kwargs,
        )  # fmt: skip

    def _check_reference(self, samples: list[TrainSample]) -> None:
        check_reference(self.loss_fn, self.config.loss_kwargs, samples)  # same rule, same message as TorchTrainer

    def compute_loss(self, batch: Sequence[TrainSample]) -> Any:
        """The loss (``LossOutput``) of this rank's part of ``batch`` as one micro-batch, with gradient graph."""
        local, _ = self._local_shard(batch)
        self._check_reference(local)
        with self.train_context():
            return self._forward_loss(local, num_tokens=None, num_seqs=None)

    def gradients(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> dict[str, torch.Tensor]:
        """The whole batch's loss gradient under HF names (full tensors, on CPU), without an optimizer step.

        Collective: every rank calls it. For checking layouts against each other and against
        ``TorchTrainer``; the gradients are cleared again afterwards.
        """
        from torch.distributed.tensor import DTensor
        from torchtitan.components.checkpoint_utils import canonical_fqn
        from torchtitan.models.common.attention import FusedQKVLinear

        self.optimizers.zero_grad()
        self._backward(batch)
        grads: dict[str, torch.Tensor] = {}
        for name, param in self.model.named_parameters():
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            grads[canonical_fqn(name)] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().cpu()
        self.optimizers.zero_grad()
        for name, module in self.model.named_modules():
            if isinstance(module, FusedQKVLinear):  # torchtitan's own wqkv -> wq/wk/wv split
                module._split_qkv_on_save(module, grads, canonical_fqn(name) + ".", None)
        return self.sd_adapter.to_hf(grads) if self.sd_adapter is not None else grads

    def _reduce(self, metrics: dict[str, float], local_tokens: float) -> dict[str, float]:
        """Merge the dp ranks' metrics as ``combine_metrics`` merges micro-batches: losses add up (global
        denominators), extremes stay extremes, the rest is averaged weighted by sampled tokens."""
        if self.dp_size == 1:
            return metrics
        from torch.distributed import ReduceOp

        group = self.parallel_dims.get_mesh("batch").get_group()
        keys = sorted(metrics)
        kinds = {k: "sum" if k in ("loss", "pg_loss") else "min" if k.endswith("_min")
                 else "max" if k.endswith("_max") else "mean" for k in keys}  # fmt: skip
        out: dict[str, float] = {}
        for kind, op in (("sum", ReduceOp.SUM), ("min", ReduceOp.MIN), ("max", ReduceOp.MAX), ("mean", ReduceOp.SUM)):
            names = [k for k in keys if kinds[k] == kind]  # the same on every rank: same loss, same keys
            weight = local_tokens if kind == "mean" else 1.0
            values = torch.tensor([metrics[k] * weight for k in names] + [local_tokens], dtype=torch.float64,
                                  device=self.device)
            torch.distributed.all_reduce(values, op=op, group=group)
            total = float(values[-1]) if kind == "mean" else 1.0
            out.update({k: float(v) / max(total, 1e-12) for k, v in zip(names, values[:-1].tolist(), strict=True)})
        return out

    @torch.no_grad()
    def logprobs(self, batch: Sequence[TrainSample] | Sequence[Sequence[TrainSample]]) -> list[list[float]]:
        """Logprob of every token of this rank's samples (0.0 for token 0)."""
        local, _ = self._local_shard(batch)
        out: list[list[float]] = []
        with self.train_context():
            for chunk in split_micro_batches(local, self.config.micro_batch_size):
                logprobs, _, _ = self._forward(chunk, with_entropy=False)
                rows = logprobs.float().cpu().tolist()
                out.extend([0.0, *row[: s.num_tokens - 1]] for s, row in zip(chunk, rows, strict=True))
        return out

    # ---------------------------------------------------------------------- weights

    def state_dict_for_generators(self, *, full: bool = False) -> dict[str, torch.Tensor]:
        """Full (unsharded) weights under HF names, on CPU, in ``generator_dtype``. Collective: all ranks call it.
        ``full`` changes nothing: a TitanTrainer has no adapter (it refuses ``lora``)."""
        from forge_env.rl.titan_support import hf_state_dict

        dtype = DTYPES[self.config.generator_dtype] if self.config.generator_dtype else None
        return hf_state_dict(self.model, self.sd_adapter, dtype)

    def push_weights(self, version: int, *, full: bool = False) -> WeightsInfo | None:
        """Publish the weights as ``version`` (rank 0 writes; every rank must call). Returns rank 0's info.
        ``full`` changes nothing (always the full weights: no adapter)."""
        if self.weight_store is None:
            raise RuntimeError("this TitanTrainer has no weight_store; construct it with weight_store=WeightStore(...)")
        state = self.state_dict_for_generators()
        info = self.weight_store.put(state, version) if self.rank == 0 else None
        torch.distributed.barrier()
        self.policy_version = version
        return info

    # ------------------------------------------------------------------ checkpoints

    def _dcp_state(self) -> dict[str, Any]:
        from torchtitan.components.checkpoint import ModelWrapper

        return {
            "model": ModelWrapper(self.model_parts),
            "optimizer": self.optimizers,
            "lr_scheduler": self.lr_schedulers,
            "train_state": self,
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Sharded checkpoint (torch.distributed.checkpoint) of model, optimizer, schedule, step and RNG."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._dcp_state(), checkpoint_id=str(path))
        return Path(path)

    def load(self, path: str | os.PathLike) -> None:
        """Restore what ``save`` wrote (any parallelism layout; DCP reshards)."""
        import torch.distributed.checkpoint as dcp

        if not Path(path).exists():
            raise FileNotFoundError(f"{path} is not a TitanTrainer checkpoint")
        dcp.load(self._dcp_state(), checkpoint_id=str(path))

    def close(self) -> None:
        self.checkpointer.close()
