"""Gymnasium spaces for text environments: a list of chat messages, and an assistant action."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from forge_env.types import MessageFormatError, validate_message


class MessagesSpace(gymnasium.Space):
    """Observations: a list of chat messages (``role``/``content`` dicts)."""

    def __init__(self, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, list):
            return False
        try:
            for message in x:
                validate_message(message)
        except MessageFormatError:
            return False
        return True

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"message {int(self.np_random.integers(1_000_000))}"}]

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "MessagesSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MessagesSpace)


class AssistantActionSpace(gymnasium.Space):
    """Actions: the assistant's turn, as raw text or as an assistant message dict."""

    def __init__(self, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        try:
            return validate_message(x)["role"] == "assistant"
        except MessageFormatError:
            return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return f"answer {int(self.np_random.integers(1_000_000))}"

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "AssistantActionSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AssistantActionSpace)
