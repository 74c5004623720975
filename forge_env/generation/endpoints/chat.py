"""Message-level generation over ``/v1/chat/completions`` with the official ``openai`` SDK.

For hosted models that take messages, not tokens: the server applies its own chat template and returns the
assistant message with structured tool calls (nothing is parsed from text here). Such episodes have no
token ids, no loss mask and no sampler logprobs: they can be evaluated, never trained on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge_env.generation.base import SamplingParams
from forge_env.generation.endpoints.config import (
    RETRYABLE_STATUSES,
    EndpointConfig,
    EndpointError,
    EndpointStats,
    RetryableEndpointError,
    call_with_retries,
)
from forge_env.generation.endpoints.responses import incoming_message, json_body, parse_chat, read_capped
from forge_env.types import Message

_SENT_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


@dataclass
class ChatTurn:
    """One assistant turn from a chat endpoint: the message (tool calls structured), why it stopped, its usage."""

    message: Message
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0


class ChatEndpoint:
    """A chat-completions client with bounded concurrency, timeouts and counted retries (see ``EndpointConfig``)."""

    def __init__(self, config: EndpointConfig) -> None:
        import openai

        self.config = config
        self.stats = EndpointStats()
        self._limit = asyncio.Semaphore(config.max_concurrency)
        # The SDK's own retries are off: ours count them, and share the backoff policy with the token level.
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url, api_key=config.resolved_api_key() or "EMPTY", max_retries=0,
            timeout=openai.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            default_headers=config.extra_headers or None)

    async def chat(self, messages: Sequence[Message], tools: Sequence[dict] | None = None,
                   sampling: SamplingParams | None = None, session_id: str | None = None) -> ChatTurn:
        """The assistant's next message; raises ``EndpointError`` when the endpoint fails for good."""
        sampling = sampling or SamplingParams()
        request: dict[str, Any] = {
            "model": self.config.model, "messages": [_outgoing(m) for m in messages],
            # max_completion_tokens: the current name (reasoning models refuse max_tokens); vLLM takes it too.
            "max_completion_tokens": sampling.max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
        }
        if tools:
            request["tools"] = list(tools)
        if sampling.seed is not None:
            request["seed"] = sampling.seed
        if sampling.stop:
            request["stop"] = list(sampling.stop)
        if session_id is not None and self.config.session_header:
            request["extra_headers"] = {self.config.session_header: session_id}
        async with self._limit:
            data, retries = await call_with_retries(lambda: self._create(request), self.config, self.stats,
                                                    f"POST {self.config.base_url}/chat/completions")
        try:
            message, finish_reason, prompt_tokens, completion_tokens = parse_chat(data)
        except EndpointError as exc:
            self.stats.failures += 1
            exc.retries = retries
            raise
        return ChatTurn(message=message, finish_reason=finish_reason, prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens, retries=retries)

    async def _create(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request; the body is read here (bounded) and parsed by us, not by the SDK, which takes whatever
        shape the server sends."""
        import openai

        try:
            async with self._client.chat.completions.with_streaming_response.create(**request) as response:
                raw = await read_capped(response.iter_bytes(), self.config.max_response_bytes)
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise RetryableEndpointError(f"{type(exc).__name__}: {exc}") from exc
        except openai.APIStatusError as exc:
            if exc.status_code in RETRYABLE_STATUSES:
                raise RetryableEndpointError(f"HTTP {exc.status_code}: {exc.message}", status=exc.status_code) from exc
            raise EndpointError(f"HTTP {exc.status_code}: {exc.message}", status=exc.status_code,
                                retryable=False) from exc
        return json_body(raw)

    async def aclose(self) -> None:
        await self._client.close()


def _outgoing(message: Message) -> dict[str, Any]:
    return {key: message[key] for key in _SENT_KEYS if key in message}  # type: ignore[literal-required]


def _incoming(message: Any) -> Message:
    """The SDK's (or the raw JSON's) message as our plain ``Message`` dict, tool calls kept structured."""
    return incoming_message(message)
