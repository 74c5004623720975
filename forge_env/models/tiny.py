"""The tiny Qwen3-architecture model used by the CPU demo and the tests.

A few million parameters, the byte tokenizer's vocabulary, a context long enough for multi-turn
agentic episodes. Weights are random (seeded); the demo warms it up with SFT before RL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from forge_env.models.tokenizer import BYTE_VOCAB_SIZE, END_OF_TEXT, IM_END, PAD, build_byte_tokenizer

#: Name accepted by ``load_model_and_tokenizer`` for a freshly built tiny model (no files needed).
TINY_MODEL_ID = "forge-env/tiny-qwen3"


@dataclass
class TinyModelConfig:
    """Shape and init scale of the tiny model (defaults: ~3.2M parameters, 8k context)."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    # Exactly the byte tokenizer's size (a multiple of 8), so the model can never sample an id with no token.
    vocab_size: int = 264
    # The std of the random init. transformers' 0.02 is sized for widths in the thousands; at 256 wide it
    # is a third of the fan-in scale (1/sqrt(256) = 0.0625), and the demo's warm-up then sat on its loss
    # plateau for 337-1236 steps (12 runs over model seeds 0-4 and three CPU kernel families) before it learned to
    # copy from its prompt (issue 28). At 0.05 all 15 runs of those seeds and families got past it in 187-566 steps
    # (docs/training.md, "The first phase: when copying clicks").
    initializer_range: float = 0.05


def tiny_qwen3_config(config: TinyModelConfig | None = None):
    """A ``transformers.Qwen3Config`` for the tiny model, with the byte tokenizer's special token ids."""
    from transformers import Qwen3Config

    shape = asdict(config or TinyModelConfig())
    if shape["vocab_size"] < BYTE_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {BYTE_VOCAB_SIZE} (the byte tokenizer's size)")
    tokenizer = build_byte_tokenizer()
    rope_theta = shape.pop("rope_theta")
    return Qwen3Config(
        **shape,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        use_cache=True,
        attention_dropout=0.0,
    )


def build_tiny_model(seed: int = 0, config: TinyModelConfig | None = None):
    """A randomly initialised tiny Qwen3 model (``Qwen3ForCausalLM``, float32, eval mode), seeded.

    The global torch RNG is left untouched.
    """
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    qwen_config = tiny_qwen3_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(qwen_config)
    tokenizer = build_byte_tokenizer()
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(END_OF_TEXT)],
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.eval()


def save_tiny_model(path: str | Path, seed: int = 0, config: TinyModelConfig | None = None) -> Path:
    """Build the tiny model and its tokenizer and write both to ``path`` (a HF checkpoint directory)."""
    path = Path(path)
    build_tiny_model(seed, config).save_pretrained(path)
    build_byte_tokenizer().save_pretrained(path)
    return path
