"""Grouped-query attention for the HF generator on CPU, without copying keys and values per query head.

transformers' ``sdpa`` attention hands a masked grouped-query attention (fewer key/value heads than query
heads, e.g. Qwen3's) to ``scaled_dot_product_attention`` only after ``repeat_kv`` has copied every key and
value once per query head in the group, because on CUDA a mask with ``enable_gqa`` falls back to the slow
math kernel. A decode step of a continuous batch always has a mask (its left padding), so on CPU that copy
of the whole batch's cache, every layer, every step, is most of the attention's cost: CPU's SDPA takes
``enable_gqa`` with a mask and gives the same output bit for bit (``tests/test_generation_speedups.py``), about
five times faster for a batch of 64 rows of 200 tokens.

:func:`use_gqa_attention` switches a model to it (registered as ``forge_sdpa_gqa``, with sdpa's masks);
``HFGenerator`` does so for an ``sdpa`` model on CPU (``HFGeneratorConfig.gqa_attention``).
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "forge_sdpa_gqa"
_REGISTERED = False


def sdpa_gqa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa_attention_forward`` with the key/value heads shared by ``enable_gqa`` instead of copied."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = query.shape[1] // key.shape[1]
    if (groups == 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None
            or kwargs.get("cache") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_length = query.shape[2]
    # As sdpa_attention_forward decides: the causal flag only without a mask and with more than one query.
    is_causal = q_length > 1 and attention_mask is None and is_causal
    if is_causal and key.shape[2] > q_length:
        key, value = key[:, :, :q_length, :], value[:, :, :q_length, :]
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``forge_sdpa_gqa`` an attention implementation transformers models can be set to (sdpa's masks)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    _REGISTERED = True


def use_gqa_attention(model: Any) -> bool:
    """Switch ``model`` (on CPU, sdpa attention, grouped key/value heads) to :func:`sdpa_gqa_attention`; whether it did."""
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if (getattr(config, "_attn_implementation", None) != "sdpa" or not heads or kv_heads == heads
            or next(model.parameters()).device.type != "cpu" or not hasattr(model, "set_attn_implementation")):
        return False
    register()
    model.set_attn_implementation(NAME)
    return getattr(model.config, "_attn_implementation", None) == NAME
