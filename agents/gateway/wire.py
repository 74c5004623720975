"""OpenAI's chat-completions wire format for the gateway: request validation, responses, stream chunks, errors.

A request is checked field by field against what the gateway can honour: an unknown top-level field, a value it
cannot honour (``n > 1``, ``top_logprobs``, a non-text content part, a ``response_format`` other than text) is a
400 with an OpenAI-style error body naming the parameter, never silently ignored. Fields that change nothing for
a token-level generator (``user``, ``metadata``, ``store``, ``parallel_tool_calls``) are accepted.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from agents.gateway.core import ChatResult, GatewayError
from forge_env.generation.base import SamplingParams, SamplingParamsError
from forge_env.types import Message

ROLES = ("system", "developer", "user", "assistant", "tool")
#: Accepted and without effect on a token-level generator.
_IGNORED = frozenset({"user", "metadata", "store", "parallel_tool_calls", "service_tier", "stream_options"})
_KNOWN = frozenset({"model", "messages", "tools", "tool_choice", "n", "max_tokens", "max_completion_tokens",
                    "temperature", "top_p", "stop", "logprobs", "top_logprobs", "stream", "seed",
                    "presence_penalty", "frequency_penalty", "response_format"}) | _IGNORED
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"})
#: Keys a client library copies from a returned message; dropped when null/empty (they render nothing).
_MESSAGE_NULLABLE = frozenset({"refusal", "annotations", "audio", "function_call", "provider_specific_fields",
                               "thinking_blocks", "reasoning"})
MAX_STOP = 4


@dataclass
class ChatRequest:
    """A validated ``/v1/chat/completions`` request."""

    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    tool_choice: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_request(body: Any, max_tokens_ceiling: int, defaults: SamplingParams) -> ChatRequest:
    """Validate a decoded JSON body; raises :class:`GatewayError` naming the offending parameter."""
    if not isinstance(body, dict):
        raise GatewayError("the request body must be a JSON object")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise GatewayError(f"unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError("'model' must be a non-empty string", param="model")
    messages = _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    tool_choice = _choice(body.get("tool_choice"))
    if body.get("n") not in (None, 1):
        raise GatewayError("only n=1 is supported (one completion per call)", param="n")
    if body.get("top_logprobs") not in (None, 0):
        raise GatewayError("top_logprobs is not supported (the sampled token's logprob is returned)",
                           param="top_logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise GatewayError(f"{name} is not supported by the gateway (must be 0 or absent)", param=name)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise GatewayError("only response_format {'type': 'text'} is supported", param="response_format")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = defaults.max_tokens if limit is None else _int(limit, "max_tokens", 1)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise GatewayError(f"'stop' must be a non-empty string or a list of at most {MAX_STOP}", param="stop")
    seed = body.get("seed")
    try:
        sampling = SamplingParams(
            temperature=_number(body.get("temperature"), "temperature", defaults.temperature),
            top_p=_number(body.get("top_p"), "top_p", defaults.top_p), top_k=defaults.top_k,
            max_tokens=min(limit, max_tokens_ceiling), stop=(*defaults.stop, *stop),
            stop_token_ids=defaults.stop_token_ids,
            seed=defaults.seed if seed is None else _int(seed, "seed", -(2**63)))
    except SamplingParamsError as exc:
        raise GatewayError(str(exc)) from None
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise GatewayError("'stream' must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise GatewayError("'stream_options' must be an object", param="stream_options")
    return ChatRequest(model=model, messages=messages, tools=tools, sampling=sampling, stream=stream,
                       include_usage=bool(options.get("include_usage")), logprobs=bool(body.get("logprobs")),
                       tool_choice=tool_choice)


def _int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value >= 2**63:
        raise GatewayError(f"'{name}' must be an integer >= {low}", param=name)
    return value


def _number(value: Any, name: str, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GatewayError(f"'{name}' must be a number", param=name)
    return float(value)


def _choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        return choice
    raise GatewayError("'tool_choice' must be 'auto', 'none', 'required' or a function", param="tool_choice")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise GatewayError("'tools' must be a list", param="tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or tool.get("type") not in (
                None, "function"):
            raise GatewayError(f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                               param=f"tools[{index}]")
    return tools or None


def _messages(messages: Any) -> list[Message]:
    if not isinstance(messages, list) or not messages:
        raise GatewayError("'messages' must be a non-empty list", param="messages")
    result = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise GatewayError(f"{param} must be an object with a role in {ROLES}", param=param)
        clean: dict[str, Any] = {}
        for key, value in message.items():
            if key in _MESSAGE_KEYS:
                clean[key] = value
            elif key not in _MESSAGE_NULLABLE or value not in (None, [], {}, ""):
                raise GatewayError(f"{param} has an unsupported field {key!r}", param=f"{param}.{key}")
        clean["content"] = _content(clean.get("content"), clean["role"], param)
        calls = clean.get("tool_calls")
        if calls is not None and (clean["role"] != "assistant" or not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)):
            raise GatewayError(f"{param}.tool_calls must be a list of function calls on an assistant message",
                               param=f"{param}.tool_calls")
        if not calls:
            clean.pop("tool_calls", None)
        for key in ("name", "tool_call_id", "reasoning_content"):
            if clean.get(key) is None:
                clean.pop(key, None)
            elif not isinstance(clean[key], str):
                raise GatewayError(f"{param}.{key} must be a string", param=f"{param}.{key}")
        if clean["role"] == "developer":
            clean["role"] = "system"  # OpenAI's newer name for the system turn; templates know "system"
        result.append(clean)
    return result  # type: ignore[return-value]


def _content(content: Any, role: str, param: str) -> str | None:
    if content is None:
        if role in ("assistant",):
            return None
        raise GatewayError(f"{param}.content is required for a {role} message", param=f"{param}.content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise GatewayError(f"{param}.content: only text parts are supported", param=f"{param}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise GatewayError(f"{param}.content must be a string or a list of text parts", param=f"{param}.content")


# ----------------------------------------------------------------------------- responses
def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def _logprobs(result: ChatResult, decode: Any) -> dict[str, Any]:
    return {"content": [{"token": decode(i), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for i, lp in zip(result.token_ids, result.logprobs, strict=True)], "refusal": None}


def _usage(result: ChatResult) -> dict[str, Any]:
    completion = len(result.token_ids)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}


def response_body(request: ChatRequest, result: ChatResult, decode: Any, episode_id: str) -> dict[str, Any]:
    """The ``chat.completion`` object of one call."""
    return {"id": completion_id(), "object": "chat.completion", "created": int(time.time()), "model": request.model,
            "choices": [{"index": 0, "message": dict(result.message), "finish_reason": result.finish_reason,
                         "logprobs": _logprobs(result, decode) if request.logprobs else None}],
            "usage": _usage(result), "system_fingerprint": f"policy-v{result.policy_version}",
            "episode_id": episode_id}


def text_cuts(decode: Any, token_ids: list[int], text: str) -> list[tuple[int, int]]:
    """Where the sampled turn's ``text`` may be cut between tokens: ``(characters, tokens)`` pairs, increasing.

    Incremental and UTF-8-safe: the tokens since the last cut are decoded together (``decode``: a list of ids ->
    text, as the turn's text was decoded) and a cut is made only where that piece does not end in the middle of a
    character (U+FFFD: the next token completes it) and continues ``text`` exactly; where a piece does not continue
    the text (a tokenizer that drops a leading space when decoding alone) the cuts stop and the rest is one piece.
    """
    cuts: list[tuple[int, int]] = []
    position, start = 0, 0
    for index in range(len(token_ids)):
        piece = decode(token_ids[start:index + 1])
        if not piece or (piece.endswith("\ufffd") and index + 1 < len(token_ids)):
            continue
        if not text.startswith(piece, position):
            break  # the rest comes in one piece
        position += len(piece)
        start = index + 1
        cuts.append((position, start))
    return cuts


def stream_chunks(request: ChatRequest, result: ChatResult, decode: Any, decode_text: Any = None
                  ) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of one call: the role, then the reasoning and content one token (or
    the few tokens that complete a character) per chunk, cut from the same text as the non-streamed message
    (:func:`text_cuts`), then each tool call, then the finish reason (and the usage when asked for). Each
    chunk's ``logprobs`` hold the tokens it completes; tokens that show no text (tool-call markup, the end of
    turn) come with the finish chunk, so the logprobs reassemble to the non-streamed list in order.
    ``decode_text``: ids -> text as the turn was decoded (``ChatRenderer.decode_assistant``); without it the
    text comes in one chunk per field."""
    base = {"id": completion_id(), "object": "chat.completion.chunk", "created": int(time.time()),
            "model": request.model, "system_fingerprint": f"policy-v{result.policy_version}"}
    entries = _logprobs(result, decode)["content"] if request.logprobs else None

    def chunk(delta: dict[str, Any], finish: str | None = None, tokens: tuple[int, int] | None = None
              ) -> dict[str, Any]:
        logprobs = None
        if entries is not None and tokens is not None and tokens[1] > tokens[0]:
            logprobs = {"content": entries[tokens[0]:tokens[1]], "refusal": None}
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}

    message = result.message
    text = result.text
    fields: list[tuple[str, int, int]] = []  # (field, start, end) in ``text``, in order
    searched = 0
    for name in ("reasoning_content", "content"):
        value = message.get(name)
        if not value:
            continue
        at = text.find(value, searched)
        if at < 0:
            fields.append((name, -1, -1))  # not a slice of the text (the parser rewrote it): one chunk
            continue
        fields.append((name, at, at + len(value)))
        searched = at + len(value)
    cuts = text_cuts(decode_text, result.token_ids, text) if decode_text is not None and text else []
    chunks = [chunk({"role": "assistant", "content": ""})]
    pending, previous = 0, 0
    sent = {name: start for name, start, _ in fields}
    for position, tokens in cuts:
        delta = {}
        for name, start, end in fields:
            low, high = max(previous, start), min(position, end)
            if start >= 0 and high > low:
                delta[name] = text[low:high]
                sent[name] = high
        previous = position
        if delta:
            chunks.append(chunk(delta, tokens=(pending, tokens)))
            pending = tokens
    for name, start, end in fields:  # whatever the cuts did not reach
        if start < 0:
            chunks.append(chunk({name: message[name]}))  # type: ignore[literal-required]
        elif sent[name] < end:
            chunks.append(chunk({name: text[sent[name]:end]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk({}, finish=result.finish_reason, tokens=(pending, len(result.token_ids))))
    if request.include_usage:
        chunks.append({**base, "choices": [], "usage": _usage(result)})
    return chunks


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
