"""The ``Tokenizer`` protocol: the part of a transformers tokenizer that forge-env calls.

Any ``transformers`` ``PreTrainedTokenizerBase`` fits (the byte-level tokenizer of the tiny model kit
included); ``ChatRenderer``, the generators and the training app use only these members.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids, chat templates, special tokens."""

    chat_template: str | dict[str, str] | None
    eos_token_id: int | None
    pad_token_id: int | None

    def __call__(self, text: str, *, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        """Encode ``text``; the result maps ``"input_ids"`` to the ids."""
        ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False, **kwargs: Any) -> str: ...

    def apply_chat_template(self, conversation: Sequence[Any], **kwargs: Any) -> Any:
        """Render messages with the chat template (text with ``tokenize=False``, else token ids)."""
        ...

    def convert_tokens_to_ids(self, tokens: Any) -> Any: ...

    def convert_ids_to_tokens(self, ids: Any) -> Any: ...
