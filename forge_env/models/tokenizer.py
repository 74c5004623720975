"""The byte-level tokenizer of the tiny model, built locally (no downloads).

Every byte is one token (ids 0-255, in byte order), followed by the chat control tokens of the Qwen
family as single tokens. The result is an ordinary HF fast tokenizer (``PreTrainedTokenizerFast``)
carrying a compact Qwen-style chat template with tool support, so it saves and loads with
``save_pretrained``/``AutoTokenizer.from_pretrained`` like any real checkpoint's tokenizer.
"""

from __future__ import annotations

from importlib import resources

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
PAD = "<|pad|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

#: Control tokens that ``skip_special_tokens`` removes when decoding.
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END, PAD)
#: Markup tokens that stay visible in decoded text (as in Qwen), so tool-call parsers can see them.
MARKUP_TOKENS: tuple[str, ...] = (TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END)
NUM_BYTE_TOKENS = 256
#: Vocabulary size of the byte tokenizer (bytes + control + markup tokens).
BYTE_VOCAB_SIZE = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)


def tiny_chat_template() -> str:
    """The compact Qwen-style jinja2 chat template shipped with the tiny model."""
    return resources.files("forge_env.models").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def build_byte_tokenizer(chat_template: str | None = None):
    """Build the byte-level tokenizer as a ``transformers.PreTrainedTokenizerFast``.

    Token id ``b`` is byte ``b``; the control tokens follow in the order of ``SPECIAL_TOKENS`` then
    ``MARKUP_TOKENS``. ``eos_token`` is ``<|im_end|>`` (the end of an assistant turn, as in Qwen instruct
    models) and ``pad_token`` is ``<|pad|>``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel maps each byte to a printable character (GPT-2's table); order the vocabulary by byte value.
    byte_to_char = _bytes_to_unicode()
    assert sorted(alphabet) == sorted(byte_to_char.values())
    vocab = {byte_to_char[b]: b for b in range(NUM_BYTE_TOKENS)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template if chat_template is not None else tiny_chat_template()
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table (the one ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))
