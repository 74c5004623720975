"""What TitanTrainer needs from torchtitan beyond its stock GPU path: the device, CPU attention, HF shapes.

torchtitan 0.3 assumes an accelerator: with none it still picks ``"cuda"`` (copied at import into
several modules), its flex attention has no CPU backward, and FSDP's PREMUL_SUM reduction does
not exist in gloo. ``select_device`` points torchtitan at the CPU when there is no GPU;
``BlockCausalSDPA`` is an inner attention with a CPU backward that reads the packed documents'
boundaries from ``position_ids`` exactly as torchtitan's flex mask does; and
``qwen3_config_from_hf`` / ``llama3_config_from_hf`` build a torchtitan Qwen3 / Llama3 config of any shape
from a HF ``config.json`` (the tiny model kit's model, or a real checkpoint such as SmolLM2), so the flavor
need not be one of torchtitan's.

Everything here imports torchtitan lazily (it imports triton at import time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: torchtitan modules that copy ``torchtitan.tools.utils.device_type`` / ``device_module`` at import.
_DEVICE_GLOBALS = ("torchtitan.tools.utils", "torchtitan.distributed.utils", "torchtitan.distributed.parallel_dims")

#: Attention backends: torchtitan's own (GPU) and ours (any device).
CPU_ATTENTION = "sdpa_block_causal"


def select_device(requested: str = "auto") -> str:
    """``"cuda"`` (``auto`` with a GPU visible) or ``"cpu"``; for the CPU, torchtitan's device globals
    (which fall back to ``"cuda"``) are pointed at it."""
    if requested not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, got {requested!r}")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was requested but CUDA is not available; use device='cpu' or 'auto'")
    if requested != "cpu" and torch.cuda.is_available():
        return "cuda"
    import importlib

    for name in _DEVICE_GLOBALS:
        module = importlib.import_module(name)
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = torch.cpu
    return "cpu"


def default_attention(device_type: str) -> str:
    """flex attention on a GPU (torchtitan's default); block-causal SDPA elsewhere (flex has no CPU backward)."""
    return "flex" if device_type == "cuda" else CPU_ATTENTION


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``(B, 1, L, L)`` boolean mask: causal within each packed document (a document starts where
    its position is 0), nothing across documents; the rule of torchtitan's packed-document flex mask."""
    document = torch.cumsum((position_ids == 0).to(torch.int32), dim=-1)
    same_document = document.unsqueeze(-1) == document.unsqueeze(-2)
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return (same_document & causal).unsqueeze(1)


def _sdpa_class() -> type:
    """``BlockCausalSDPA`` built on torchtitan's Module (so its config plugs into torchtitan's layer configs)."""
    global _SDPA_CLASS
    if _SDPA_CLASS is not None:
        return _SDPA_CLASS
    import torch.nn.functional as F
    from torchtitan.protocols.module import Module

    class BlockCausalSDPA(Module):
        """Inner attention: ``scaled_dot_product_attention`` under a block-causal boolean mask."""

        @dataclass(kw_only=True, slots=True)
        class Config(Module.Config):
            pass

        def __init__(self, config: Config) -> None:
            super().__init__()

        def forward(
            self,
            q_BLNH: torch.Tensor,
            k_BLNH: torch.Tensor,
            v_BLNH: torch.Tensor,
            *,
            attention_masks: torch.Tensor,
            scale: float | None = None,
            enable_gqa: bool = False,
            **kwargs: Any,
        ) -> torch.Tensor:
            if not isinstance(attention_masks, torch.Tensor) or attention_masks.dtype != torch.bool:
                raise TypeError("BlockCausalSDPA needs the boolean mask from block_causal_mask(position_ids)")
            q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_masks, scale=scale, enable_gqa=enable_gqa)
            return out.transpose(1, 2)

    _SDPA_CLASS = BlockCausalSDPA
    return BlockCausalSDPA


_SDPA_CLASS: type | None = None


def use_block_causal_sdpa(model_config: Any) -> None:
    """Swap every layer's inner attention config for ``BlockCausalSDPA`` (before the model is built)."""
    config_cls = _sdpa_class().Config
    for layer in model_config.layers:
        attention = getattr(layer, "attention", None)
        if attention is not None:
            attention.inner_attention = config_cls()


def uses_block_causal_sdpa(model: torch.nn.Module) -> bool:
    return _SDPA_CLASS is not None and any(isinstance(m, _SDPA_CLASS) for m in model.modules())


def qwen3_config_from_hf(hf_assets_path: str | Path, *, attn_backend: str = "flex", fuse_qkv: bool = True) -> Any:
    """A torchtitan ``Qwen3Model.Config`` with the shape in ``hf_assets_path/config.json`` (dense Qwen3 only)."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.qwen3 import _EMBEDDING_INIT, _LINEAR_INIT, _build_qwen3_layers, _qwen3_norm
    from torchtitan.models.qwen3.model import Qwen3Model

    hf = _read_hf_config(hf_assets_path, "qwen3", "qwen3")
    dim, vocab, head_dim = hf["hidden_size"], hf["vocab_size"], hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    theta = _rope_theta(hf)
    tied = bool(hf.get("tie_word_embeddings", False))
    inner = "flex" if attn_backend == CPU_ATTENTION else attn_backend
    config = Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=_qwen3_norm(dim),
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_LINEAR_INIT),
        layers=_build_qwen3_layers(
            fuse_qkv=fuse_qkv,
            n_layers=hf["num_hidden_layers"],
            dim=dim,
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=head_dim,
            hidden_dim=hf["intermediate_size"],
            attn_backend=inner,
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=hf.get("max_position_embeddings", 4096), theta=theta),
        ),
    )
    for layer in config.layers:  # HF Qwen3 RMSNorm epsilon
        for norm in (layer.attention_norm, layer.ffn_norm, layer.attention.qk_norm):
            norm.eps = hf.get("rms_norm_eps", norm.eps)
    config.norm.eps = hf.get("rms_norm_eps", config.norm.eps)
    if attn_backend == CPU_ATTENTION:
        use_block_causal_sdpa(config)
    return config


def _read_hf_config(hf_assets_path: str | Path, model_type: str, family: str) -> dict[str, Any]:
    path = Path(hf_assets_path) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: flavor='hf' needs hf_assets_path pointing at a HF checkpoint")
    hf = json.loads(path.read_text())
    if hf.get("model_type") != model_type:
        found = {v: k for k, v in HF_FAMILIES.items()}.get(hf.get("model_type"))
        fix = f"; set model_name={found!r}" if found else f" (flavor='hf' reads {sorted(HF_FAMILIES.values())})"
        raise ValueError(f"model_name={family!r} with flavor='hf' builds {model_type} checkpoints; "
                         f"{path} has model_type={hf.get('model_type')!r}{fix}")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{path}: rope_type {rope.get('rope_type')!r} is not supported (only 'default')")
    return hf


def _rope_theta(hf: dict[str, Any]) -> float:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def llama3_config_from_hf(hf_assets_path: str | Path, *, attn_backend: str = "flex") -> Any:
    """A torchtitan ``Llama3Model.Config`` with the shape in ``hf_assets_path/config.json`` (HF ``llama``).

    What differs from torchtitan's own Llama 3 flavors is taken from the checkpoint: tied embeddings
    (``tie_word_embeddings``), the RoPE base (``rope_theta``, without Llama 3.1's frequency scaling, which
    ``rope_type: default`` means), the FFN width (``intermediate_size``, not a multiple rule) and the RMSNorm
    epsilon. torchtitan's llama3 rotates interleaved pairs (``ComplexRoPE``); its state-dict adapter permutes
    the HF q/k projections to match, so the same checkpoint computes the same function. Attention biases and
    a ``head_dim`` other than ``hidden_size / num_attention_heads`` have no place in torchtitan's llama3: refused.
    """
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        _build_llama3_layers,
        _output_linear_init,
    )
    from torchtitan.models.llama3.model import Llama3Model

    hf = _read_hf_config(hf_assets_path, "llama", "llama3")
    dim, vocab, n_heads = hf["hidden_size"], hf["vocab_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or dim // n_heads
    if head_dim * n_heads != dim:
        raise ValueError(f"{hf_assets_path}: head_dim {head_dim} x {n_heads} heads != hidden_size {dim}; "
                         "torchtitan's llama3 needs head_dim = hidden_size / num_attention_heads")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError(f"{hf_assets_path}: attention/MLP biases are not part of torchtitan's llama3")
    inner = "flex" if attn_backend == CPU_ATTENTION else attn_backend
    config = Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=bool(hf.get("tie_word_embeddings", False)),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT, eps=hf.get("rms_norm_eps", 1e-5)),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=_build_llama3_layers(
            fuse_qkv=True,
            n_layers=hf["num_hidden_layers"],
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            hidden_dim=hf["intermediate_size"],
            rope=ComplexRoPE.Config(dim=head_dim, max_seq_len=hf.get("max_position_embeddings", 4096),
                                    theta=_rope_theta(hf), scaling="none"),
            attn_backend=inner,
        ),
    )
    for layer in config.layers:
        layer.attention_norm.eps = layer.ffn_norm.eps = hf.get("rms_norm_eps", layer.ffn_norm.eps)
    if attn_backend == CPU_ATTENTION:
        use_block_causal_sdpa(config)
    return config


#: flavor="hf": torchtitan model family -> the HF ``model_type`` it reads, and the config builder.
HF_FAMILIES = {"qwen3": "qwen3", "llama3": "llama"}


def hf_model_name(hf_assets_path: str | Path, default: str) -> str:
    """The torchtitan family that reads the checkpoint in ``hf_assets_path`` (its ``model_type``), else ``default``."""
    path = Path(hf_assets_path) / "config.json"
    model_type = json.loads(path.read_text()).get("model_type") if path.exists() else None
    return next((family for family, hf_type in HF_FAMILIES.items() if hf_type == model_type), default)


def model_spec(model_name: str, flavor: str, attn_backend: str, hf_assets_path: str | Path = "") -> Any:
    """torchtitan's ``ModelSpec`` for ``model_name``/``flavor`` (``"hf"``: the shape of ``hf_assets_path``),
    its attention set to ``attn_backend``. Builds configs only: no weights, no device."""
    import importlib

    registry = importlib.import_module(f"torchtitan.models.{model_name}").model_registry
    titan_backend = "flex" if attn_backend == CPU_ATTENTION else attn_backend
    if flavor == "hf":
        if model_name not in HF_FAMILIES:
            raise ValueError(f"flavor='hf' is available for model_name in {sorted(HF_FAMILIES)}, not {model_name!r}")
        spec = registry("debugmodel", attn_backend=titan_backend)
        spec.flavor = "hf"
        build = qwen3_config_from_hf if model_name == "qwen3" else llama3_config_from_hf
        spec.model = build(hf_assets_path, attn_backend=attn_backend)
        return spec
    spec = registry(flavor, attn_backend=titan_backend)
    if attn_backend == CPU_ATTENTION:
        use_block_causal_sdpa(spec.model)
    return spec


def fit_seq_len(model_config: Any, seq_len: int) -> None:
    """Size every layer's RoPE cache for ``seq_len`` (refusing one longer than the model supports)."""
    from dataclasses import replace

    for layer in model_config.layers:
        attention = getattr(layer, "attention", None)
        if attention is not None:
            if seq_len > attention.rope.max_seq_len:
                raise ValueError(f"seq_len {seq_len} exceeds the model's max_seq_len {attention.rope.max_seq_len}")
            attention.rope = replace(attention.rope, max_seq_len=seq_len)


def hf_state_dict(model: torch.nn.Module, sd_adapter: Any, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``model``'s full (unsharded) weights under HF names, on CPU, floating weights cast to ``dtype``.

    Collective when the model is sharded (every rank calls it). torchtitan's adapter drops a
    tied ``lm_head.weight``; this keeps it (equal to the embedding), so the key set is that of a
    transformers state dict (what TorchTrainer pushes) and loads strictly into a transformers model;
    vLLM skips the tied name itself.
    """
    from torch.distributed.tensor import DTensor
    from torchtitan.components.checkpoint_utils import canonical_fqn

    buffers = {canonical_fqn(name) for name, _ in model.named_buffers()}
    full: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        name = canonical_fqn(name)
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if dtype is not None and tensor.is_floating_point() and name not in buffers:
            tensor = tensor.to(dtype)
        full[name] = tensor.detach() if tensor.is_meta else tensor.detach().cpu()  # meta: shapes only
    if sd_adapter is None:
        return full
    hf = sd_adapter.to_hf(full)
    if getattr(sd_adapter.model_config, "enable_weight_tying", False) and "lm_head.weight" in full:
        hf.setdefault("lm_head.weight", hf["model.embed_tokens.weight"])
    return hf
