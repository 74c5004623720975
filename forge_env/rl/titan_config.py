"""TitanTrainer's configuration and the checks around it, importable without torchtitan (config loading
and validation must stay cheap); the trainer itself is in :mod:`forge_env.rl.titan`."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

from forge_env.config import ConfigError
from forge_env.rl.trainer import TrainerConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class TitanUnavailableError(RuntimeError):
    """torchtitan is not installed (or cannot be imported)."""


@dataclass
class TitanTrainerConfig(TrainerConfig):
    """TrainerConfig plus the torchtitan model and parallelism settings.

    Of the inherited fields, ``packing`` is always on, ``device`` is ``auto`` (the rank's
    CUDA device, or the CPU where there is none), ``cuda`` or ``cpu``, ``precision`` follows
    ``mixed_precision_param`` and ``max_tokens_per_micro_batch`` is not used (ranks must
    run the same number of micro-batches, so they are cut by count).
    """

    model_name: str = "qwen3"
    flavor: str = "0.6B"
    """A flavor of torchtitan's registry for ``model_name``, or ``"hf"``: the shape in ``hf_assets_path/config.json``
    (``model_name`` ``qwen3`` reads a HF ``qwen3`` checkpoint, ``llama3`` a HF ``llama`` one)."""
    hf_assets_path: str = ""
    """Local HF checkpoint directory (config.json + safetensors) to initialise from; empty: random init."""
    attn_backend: str = "auto"
    """``auto``: ``flex`` on a GPU, ``sdpa_block_causal`` on the CPU; or any of those, or torchtitan's ``varlen``."""
    seq_len: int = 4096
    data_parallel_shard_degree: int = -1
    data_parallel_replicate_degree: int = 1
    tensor_parallel_degree: int = 1
    param_dtype: str = "float32"
    mixed_precision_param: str = "auto"
    """FSDP's compute dtype: ``auto`` is ``bfloat16`` on a GPU and ``float32`` on the CPU (as TorchTrainer's precision)."""
    generator_dtype: str | None = "bfloat16"
    """Cast pushed weights to this dtype (what the generators run in); None keeps the training dtype."""
    pad_to_multiple: int = 128
    dump_folder: str = "./outputs/titan"
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lora is not None:
            raise ConfigError(
                "trainer.lora is not supported with trainer.backend=titan: torchtitan 0.3.0 has a LoRA model "
                "converter (torchtitan.components.lora.LoRAConverter, torchtitan module names wq/wk/w1...), but "
                "TitanTrainer does not wire it in nor push/save its adapter in PEFT form; train LoRA with "
                "trainer.backend=torch (TorchTrainer)")
        self.packing = True
        if self.generator_dtype is not None and self.generator_dtype not in DTYPES:
            raise ValueError(f"generator_dtype must be one of {sorted(DTYPES)} or None")
        if self.mixed_precision_param not in ("auto", "bfloat16", "float32"):
            raise ValueError("mixed_precision_param must be auto, bfloat16 or float32")
        if self.param_dtype not in DTYPES:
            raise ValueError(f"param_dtype must be one of {sorted(DTYPES)}")
        if self.attn_backend not in ("auto", "flex", "flex_flash", "varlen", "sdpa_block_causal"):
            raise ValueError(f"unknown attn_backend {self.attn_backend!r}; "
                             "choose auto, flex, flex_flash, varlen or sdpa_block_causal")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be auto, cuda or cpu (ranks take their local GPU), got {self.device!r}")
        if self.flavor == "hf" and not self.hf_assets_path:
            raise ValueError("flavor='hf' takes the model's shape from hf_assets_path; set hf_assets_path")


def import_torchtitan() -> None:
    try:
        import torchtitan  # noqa: F401
    except ImportError as exc:
        raise TitanUnavailableError(
            f"torchtitan is not importable ({exc}); install it: pip install 'forge-env[engines-cpu]' "
            "(CPU) or 'forge-env[gpu]'"
        ) from exc


def default_dist_env() -> list[str]:
    """Single-process defaults so a lone TitanTrainer works without torchrun; returns the names it set."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost"}
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            defaults["MASTER_PORT"] = str(s.getsockname()[1])
    added = [name for name in defaults if name not in os.environ]
    os.environ.update({name: defaults[name] for name in added})
    return added
