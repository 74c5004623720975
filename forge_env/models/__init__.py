"""Tiny model kit: byte-level tokenizer, small Qwen3 config, uniform model loading; the ``Tokenizer`` protocol.

``load_model_and_tokenizer`` treats the built-in tiny model and a real checkpoint identically, so demos,
tests and GPU recipes share one code path. Importing this package does not import torch/transformers.
"""

from forge_env.models.loading import ModelLoadError, load_model_and_tokenizer, load_tokenizer
from forge_env.models.protocol import Tokenizer
from forge_env.models.tiny import (
    TINY_MODEL_ID,
    TinyModelConfig,
    build_tiny_model,
    save_tiny_model,
    tiny_qwen3_config,
)
from forge_env.models.tokenizer import (
    BYTE_VOCAB_SIZE,
    END_OF_TEXT,
    IM_END,
    IM_START,
    PAD,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TOOL_RESPONSE_END,
    TOOL_RESPONSE_START,
    build_byte_tokenizer,
    tiny_chat_template,
)

__all__ = [
    "BYTE_VOCAB_SIZE",
    "END_OF_TEXT",
    "IM_END",
    "IM_START",
    "PAD",
    "TINY_MODEL_ID",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "TOOL_RESPONSE_END",
    "TOOL_RESPONSE_START",
    "ModelLoadError",
    "TinyModelConfig",
    "Tokenizer",
    "build_byte_tokenizer",
    "build_tiny_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "save_tiny_model",
    "tiny_chat_template",
    "tiny_qwen3_config",
]
