"""Reading and checking what a model endpoint answered. The endpoint is hostile input, like model output.

A response body is read up to ``EndpointConfig.max_response_bytes``; its JSON is parsed without letting
``json.loads`` raise anything but our error; and its fields are checked before they reach a trajectory: token
ids are integers inside the tokenizer's vocabulary, there is one finite, non-positive logprob per token, and
no more tokens than were asked for. Anything else raises ``EndpointError`` (``retryable=False``): the episode
ends as an endpoint error, never as a model failure and never with tokens or logprobs that do not line up.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

from forge_env.generation.base import Completion
from forge_env.generation.endpoints.config import EndpointError, RetryableEndpointError
from forge_env.tools.parsed import load_json
from forge_env.types import Message

#: A logprob above this is not a log-probability (a little slack for the server's float rounding).
MAX_LOGPROB = 1e-4


def _bad(message: str) -> EndpointError:
    return EndpointError(f"the endpoint's response is malformed: {message}", retryable=False)


async def read_capped(chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
    """The whole body from ``chunks``; raises ``EndpointError`` as soon as it passes ``max_bytes``."""
    body, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise EndpointError(f"the endpoint's response is over {max_bytes} bytes (EndpointConfig."
                                "max_response_bytes); refused", retryable=False)
        body.append(chunk)
    return b"".join(body)


def json_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw``. Not JSON at all is retryable (a proxy's error page); JSON that is not an
    object is not."""
    value, reason = load_json(raw)  # type: ignore[arg-type]  # json.loads takes bytes too
    if reason is not None:
        raise RetryableEndpointError(f"the endpoint answered with invalid JSON ({reason}): {raw[:200]!r}")
    if not isinstance(value, dict):
        raise _bad(f"expected a JSON object, got {type(value).__name__}: {str(value)[:200]}")
    return value


def _first_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _bad(f"no choices: {str(data)[:200]}")
    return choices[0]


def _count(value: Any, what: str) -> int:
    """A token count from ``usage``: a non-negative integer, 0 when absent."""
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _bad(f"{what} must be a non-negative integer, got {value!r}"[:200])
    return value


def _usage(data: dict[str, Any]) -> dict[str, Any]:
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise _bad(f"usage must be an object, got {type(usage).__name__}")
    return usage


def parse_completion(data: dict[str, Any], prompt_ids: list[int], policy_version: int, *,
                     vocab_size: int | None = None, max_tokens: int | None = None) -> Completion:
    """The ``Completion`` in a ``/v1/completions`` response, checked as the module docstring says."""
    choice = _first_choice(data)
    token_ids = choice.get("token_ids")
    logprobs = choice.get("logprobs")
    logprobs = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if token_ids is None or logprobs is None:
        raise EndpointError(
            "the endpoint returned no token_ids or logprobs; token-level generation needs an OpenAI-compatible "
            "server that accepts return_token_ids and logprobs (vLLM's server); use --api chat for other APIs",
            retryable=False)
    if not isinstance(token_ids, list) or not isinstance(logprobs, list):
        raise _bad("token_ids and logprobs.token_logprobs must be lists")
    if len(token_ids) != len(logprobs):
        raise _bad(f"{len(token_ids)} token ids but {len(logprobs)} logprobs")
    if max_tokens is not None and len(token_ids) > max_tokens:
        raise _bad(f"{len(token_ids)} tokens returned, {max_tokens} asked for at most")
    for position, token in enumerate(token_ids):
        if not isinstance(token, int) or isinstance(token, bool) or token < 0 or (
                vocab_size is not None and token >= vocab_size):
            vocab = f" [0, {vocab_size})" if vocab_size is not None else ""
            raise _bad(f"token {position} is {token!r}, not a token id of the tokenizer's vocabulary{vocab}"[:300])
    for position, logprob in enumerate(logprobs):
        if not isinstance(logprob, int | float) or isinstance(logprob, bool) or not math.isfinite(logprob) or (
                logprob > MAX_LOGPROB):
            raise _bad(f"logprob {position} is {logprob!r}, not a finite log-probability <= 0"[:300])
    text = choice.get("text")
    finish = choice.get("finish_reason") or "stop"
    cached = _count((_usage(data).get("prompt_tokens_details") or {}).get("cached_tokens"), "cached_tokens")
    return Completion(
        prompt_ids=prompt_ids, token_ids=list(token_ids), logprobs=[min(float(x), 0.0) for x in logprobs],
        text=text if isinstance(text, str) else "", finish_reason=finish if finish in ("stop", "length") else "abort",
        policy_version=policy_version, num_cached_tokens=cached, stop_reason=choice.get("stop_reason"))


def parse_chat(data: dict[str, Any]) -> tuple[Message, str, int, int]:
    """``(assistant message, finish_reason, prompt_tokens, completion_tokens)`` of a ``/v1/chat/completions``
    response, tool calls kept structured."""
    choice = _first_choice(data)
    finish = choice.get("finish_reason") or "stop"
    usage = _usage(data)
    return (incoming_message(choice.get("message")), finish if isinstance(finish, str) else "stop",
            _count(usage.get("prompt_tokens"), "prompt_tokens"),
            _count(usage.get("completion_tokens"), "completion_tokens"))


def incoming_message(message: Any) -> Message:
    """An API's assistant message (a dict, or an ``openai`` SDK object) as our plain ``Message`` dict."""
    if hasattr(message, "model_dump"):
        message = message.model_dump()
    if not isinstance(message, dict):
        raise _bad(f"the choice has no message object, got {type(message).__name__}")
    content = message.get("content")
    if isinstance(content, list):  # some APIs answer with content parts
        if not all(isinstance(part, dict) and isinstance(part.get("text", ""), str) for part in content):
            raise _bad("content parts must be objects with a string 'text'")
        content = "".join(part.get("text", "") for part in content)
    if content is not None and not isinstance(content, str):
        raise _bad(f"message content must be a string, a list of parts or null, got {type(content).__name__}")
    result: Message = {"role": "assistant", "content": content or ""}
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _bad("tool_calls must be a list")
    structured = []
    for call in calls:
        if not isinstance(call, dict):
            raise _bad("each tool call must be an object")
        function = call.get("function")
        if function is None and call.get("type") not in (None, "function"):
            continue  # a custom (non-function) tool call: not something our envs offer
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not isinstance(
                function.get("arguments") or "{}", str) or not isinstance(call.get("id") or "", str):
            raise _bad(f"a tool call needs a string id, function.name and function.arguments: {str(call)[:200]}")
        structured.append({"id": call.get("id") or "", "type": "function",
                           "function": {"name": function["name"], "arguments": function.get("arguments") or "{}"}})
    if structured:
        result["tool_calls"] = structured  # type: ignore[typeddict-item]
    return result
