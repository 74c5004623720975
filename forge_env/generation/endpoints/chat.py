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
            response, retries = await call_with_retries(lambda: self._create(request), self.config, self.stats,
                                                        f"POST {self.config.base_url}/chat/completions")
        if not response.choices:
            raise EndpointError("the chat endpoint returned no choices", retryable=False, retries=retries)
        choice = response.choices[0]
        usage = response.usage
        return ChatTurn(message=_incoming(choice.message), finish_reason=choice.finish_reason or "stop",
                        prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                        completion_tokens=getattr(usage, "completion_tokens", 0) or 0, retries=retries)

    async def _create(self, request: dict[str, Any]) -> Any:
        import openai

        try:
            return await self._client.chat.completions.create(**request)
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            raise RetryableEndpointError(f"{type(exc).__name__}: {exc}") from exc
        except openai.APIStatusError as exc:
            if exc.status_code in RETRYABLE_STATUSES:
                raise RetryableEndpointError(f"HTTP {exc.status_code}: {exc.message}", status=exc.status_code) from exc
            raise EndpointError(f"HTTP {exc.status_code}: {exc.message}", status=exc.status_code,
                                retryable=False) from exc

    async def aclose(self) -> None:
        await self._client.close()


def _outgoing(message: Message) -> dict[str, Any]:
    return {key: message[key] for key in _SENT_KEYS if key in message}  # type: ignore[literal-required]


def _incoming(message: Any) -> Message:
    """The SDK's message object as our plain ``Message`` dict, tool calls kept structured."""
    content = message.content
    if isinstance(content, list):  # some APIs answer with content parts
        content = "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    result: Message = {"role": "assistant", "content": content or ""}
    calls = []
    for call in message.tool_calls or []:
        function = getattr(call, "function", None)
        if function is None:  # a custom (non-function) tool call: not something our envs offer
            continue
        calls.append({"id": call.id, "type": "function",
                      "function": {"name": function.name, "arguments": function.arguments or "{}"}})
    if calls:
        result["tool_calls"] = calls  # type: ignore[typeddict-item]
    return result
