"""Models: the tiny model kit, named real models pulled offline, uniform loading; the ``Tokenizer`` protocol.

Named models (``forge-env models list``): ``pull("smollm2-135m-instruct")`` converts the GGUF file an installed
package ships into a Hugging Face checkpoint directory once, cached (:mod:`forge_env.models.registry`,
:mod:`forge_env.models.convert`); ``resolve_model`` is the resolver every config's model path goes through.

``load_model_and_tokenizer`` treats the built-in tiny model and a real checkpoint identically, so demos,
tests and GPU recipes share one code path. Importing this package does not import torch/transformers. The
byte tokenizer's special tokens and chat template live in :mod:`forge_env.models.tokenizer`.
"""

from forge_env.models.convert import ModelConversionError, convert_gguf
from forge_env.models.loading import ModelLoadError, load_model_and_tokenizer, load_tokenizer
from forge_env.models.protocol import Tokenizer
from forge_env.models.registry import MODELS, cache_dir, list_models, pull, resolve_model
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
    "MODELS",
    "TINY_MODEL_ID",
    "ModelConversionError",
    "ModelLoadError",
    "TinyModelConfig",
    "Tokenizer",
    "build_byte_tokenizer",
    "build_tiny_model",
    "cache_dir",
    "convert_gguf",
    "list_models",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "pull",
    "resolve_model",
    "save_tiny_model",
]
