"""Tiny model kit: byte-level tokenizer, small Qwen3 config, uniform model loading; the ``Tokenizer`` protocol.

``load_model_and_tokenizer`` treats the built-in tiny model and a real checkpoint identically, so demos,
tests and GPU recipes share one code path. Importing this package does not import torch/transformers. The
byte tokenizer's special tokens and chat template live in :mod:`forge_env.models.tokenizer`.
"""

from forge_env.models.loading import ModelLoadError, load_model_and_tokenizer, load_tokenizer
from forge_env.models.protocol import Tokenizer
from forge_env.models.tiny import (
    TINY_MODEL_ID,
    TinyModelConfig,
    build_tiny_model,
    save_tiny_model,
)
from forge_env.models.tokenizer import (
    BYTE_VOCAB_SIZE,
    build_byte_tokenizer,
)

__all__ = [
    "BYTE_VOCAB_SIZE",
    "TINY_MODEL_ID",
    "ModelLoadError",
    "TinyModelConfig",
    "Tokenizer",
    "build_byte_tokenizer",
    "build_tiny_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "save_tiny_model",
]
