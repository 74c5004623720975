"""The tool-call formats of the model families people train, one parser each.

Written here rather than taken from vLLM (``vllm.tool_parsers``): vLLM's parsers need a tokenizer and a
request object, import the engine (seconds, and optional for the CPU core), and on one malformed call
drop *every* call of the turn and log the exception, where an environment must answer each bad call with
a specific error and execute the good ones. The formats below follow the published chat templates;
each is tested on text a template of that family renders (tests/test_tool_formats.py).

========================  ==========================================================================
name                      what the model writes
========================  ==========================================================================
``hermes`` / ``qwen``     ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (any number)
``llama3_json``           ``{"name": ..., "parameters": {...}}`` as the whole turn, optionally after
                          ``<|python_tag|>``; several separated by ``;``
``mistral``               ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 / Nemo) or
                          ``[TOOL_CALLS]name[ARGS]{...}`` (v11+)
``deepseek_v3``           ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name``
                          ``\\n```json\\n{...}\\n```<｜tool▁call▁end｜>…``; V3.1's
                          ``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` too
``harmony`` (gpt-oss)     messages ``<|channel|>analysis|commentary|final … <|message|>…`` ending in
                          ``<|end|>``/``<|call|>``/``<|return|>``; a call is a commentary message
                          ``to=functions.NAME``; ``analysis`` is reasoning
``kimi_k2``               ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0``
                          ``<|tool_call_argument_begin|>{...}<|tool_call_end|>…``
========================  ==========================================================================

Every parser except harmony first splits ``<think>…</think>`` off (:func:`split_reasoning`); calls
written inside reasoning are not calls.
"""

from __future__ import annotations

import json
import re

from forge_env.tools.parsed import CallCollector, ParsedAction, ToolCallParser, load_json, split_reasoning

# ----------------------------------------------------------------------------- Hermes / Qwen

_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> ParsedAction:
    """Hermes/Qwen ``<tool_call>`` blocks; an unclosed block at the end is parsed too."""
    reasoning, rest = split_reasoning(text)
    calls = CallCollector()
    for match in _HERMES_CALL.finditer(rest):
        calls.add_json(match.group(1))
    return calls.result(_HERMES_CALL.sub("", rest), reasoning)


# ----------------------------------------------------------------------------- Llama 3.x JSON

_PYTHON_TAG = "<|python_tag|>"


def parse_llama3_json(text: str) -> ParsedAction:
    """Llama-3.x JSON calls: the turn is ``{"name": ..., "parameters": {...}}`` (``;``-separated for several).

    A turn that is not a JSON object naming a tool is plain content (a final answer may mention braces).
    """
    reasoning, rest = split_reasoning(text)
    body = rest.strip()
    tagged = body.startswith(_PYTHON_TAG)
    if tagged:
        body = body[len(_PYTHON_TAG):].strip()
    if not body.startswith("{") or ('"name"' not in body and not tagged):
        return ParsedAction(content=rest.strip(), reasoning=reasoning, raw_content=rest)
    calls = CallCollector()
    decoder = json.JSONDecoder()
    position = 0
    while position < len(body):
        try:
            _, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            end = len(body)
        except (RecursionError, ValueError):
            end = len(body)
        calls.add_json(body[position:end])
        position = end
        while position < len(body) and body[position] in " \n\t;":
            position += 1
    return calls.result("", reasoning)


# ----------------------------------------------------------------------------- Mistral

_MISTRAL_CALLS = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_MISTRAL_CALL_ID = "[CALL_ID]"


def parse_mistral(text: str) -> ParsedAction:
    """Mistral ``[TOOL_CALLS]``: a JSON list of calls (v3, Nemo) or ``name[ARGS]{...}`` per call (v11+)."""
    reasoning, rest = split_reasoning(text)
    start = rest.find(_MISTRAL_CALLS)
    if start < 0:
        return ParsedAction(content=rest.strip(), reasoning=reasoning, raw_content=rest)
    calls = CallCollector()
    tail = rest[start:]
    for chunk in tail.split(_MISTRAL_CALLS)[1:]:
        chunk = chunk.strip()
        if _MISTRAL_ARGS in chunk:
            name, _, arguments = chunk.partition(_MISTRAL_ARGS)
            name = name.split(_MISTRAL_CALL_ID)[0].strip()
            calls.add(name, arguments.strip())
            continue
        payload, problem = load_json(chunk)
        if problem:
            calls.add_json(chunk)  # records the error with its position
            continue
        for item in payload if isinstance(payload, list) else [payload]:
            if isinstance(item, dict):
                calls.add(item.get("name"), item.get("arguments", item.get("parameters", {})),
                          item.get("id") if isinstance(item.get("id"), str) else None)
            else:
                calls.add(None, None)
    return calls.result(rest[:start], reasoning)


# ----------------------------------------------------------------------------- DeepSeek V3 / V3.1

_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)(?:<｜tool▁call▁end｜>|$)", re.DOTALL)
_DS_SEP = "<｜tool▁sep｜>"
_DS_V3_ARGS = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def parse_deepseek_v3(text: str) -> ParsedAction:
    """DeepSeek-V3 (``function<｜tool▁sep｜>name`` + fenced JSON) and V3.1 (``name<｜tool▁sep｜>{...}``)."""
    reasoning, rest = split_reasoning(text)
    start = rest.find(_DS_CALLS_BEGIN)
    if start < 0:
        return ParsedAction(content=rest.strip(), reasoning=reasoning, raw_content=rest)
    calls = CallCollector()
    for match in _DS_CALL.finditer(rest, start):
        head, sep, after = match.group(1).partition(_DS_SEP)
        if not sep:
            calls.add(None, None)
            continue
        if head.strip() == "function" and "\n" in after:  # V3: the name, then the arguments in a fence
            name, _, arguments = after.partition("\n")
            fenced = _DS_V3_ARGS.match(arguments)
            calls.add(name.strip(), fenced.group(1) if fenced else arguments)
        else:
            calls.add(head.strip(), after.strip())
    return calls.result(rest[:start], reasoning)


# ----------------------------------------------------------------------------- gpt-oss harmony

_H_START, _H_CHANNEL, _H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
_H_ENDS = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
#: The recipient ends at whitespace or at the next tag: the published template writes it before the channel
#: (``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``).
_H_RECIPIENT = re.compile(r"to=([^\s<]+)")


def parse_harmony(text: str) -> ParsedAction:
    """gpt-oss harmony: ``analysis`` is reasoning, ``final`` (and plain commentary) is content, a commentary
    message addressed ``to=functions.NAME`` is a call whose body is its JSON arguments."""
    calls = CallCollector()
    reasoning: list[str] = []
    content: list[str] = []
    position = 0
    while position < len(text):
        marker = text.find(_H_MESSAGE, position)
        if marker < 0:
            if text[position:].strip() and _H_CHANNEL not in text[position:]:
                content.append(text[position:])
            break
        header = text[position:marker]
        if _H_START in header:
            header = header[header.rfind(_H_START) + len(_H_START):]
        body_end = _H_ENDS.search(text, marker)
        end = body_end.start() if body_end else len(text)
        body = text[marker + len(_H_MESSAGE):end]
        position = body_end.end() if body_end else len(text)
        channel = header.split(_H_CHANNEL, 1)[1].split()[0] if _H_CHANNEL in header and \
            header.split(_H_CHANNEL, 1)[1].split() else ""
        recipient = _H_RECIPIENT.search(header)
        if recipient and recipient.group(1).startswith("functions."):
            calls.add(recipient.group(1)[len("functions."):], body.strip())
        elif recipient:
            calls.add(recipient.group(1), body.strip())
        elif channel == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    return calls.result("".join(content), "\n".join(reasoning) if reasoning else None)


# ----------------------------------------------------------------------------- Kimi-K2

_KIMI_SECTION = "<|tool_calls_section_begin|>"
_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(.*?)\s*<\|tool_call_argument_begin\|>(.*?)(?:<\|tool_call_end\|>|$)", re.DOTALL)


def parse_kimi_k2(text: str) -> ParsedAction:
    """Kimi-K2: ``functions.NAME:INDEX`` ids with JSON arguments inside the tool-calls section."""
    reasoning, rest = split_reasoning(text)
    start = rest.find(_KIMI_SECTION)
    if start < 0:
        return ParsedAction(content=rest.strip(), reasoning=reasoning, raw_content=rest)
    calls = CallCollector()
    for match in _KIMI_CALL.finditer(rest, start):
        call_id = match.group(1)
        name = call_id.split(":")[0]
        name = name[len("functions."):] if name.startswith("functions.") else name
        calls.add(name, match.group(2).strip(), call_id=call_id)
    return calls.result(rest[:start], reasoning)


# ----------------------------------------------------------------------------- registry and detection

#: Tokens that carry tool-call or reasoning structure: kept when a sampled turn is decoded for parsing,
#: although tokenizers often mark them special.
MARKUP_TOKENS = frozenset({
    "<think>", "</think>", "<tool_call>", "</tool_call>", _PYTHON_TAG, _MISTRAL_CALLS, _MISTRAL_ARGS,
    _MISTRAL_CALL_ID, _DS_CALLS_BEGIN, _DS_CALLS_END, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", _DS_SEP,
    _H_START, _H_CHANNEL, _H_MESSAGE, "<|end|>", "<|call|>", "<|constrain|>", _KIMI_SECTION,
    "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
})

PARSERS: dict[str, ToolCallParser] = {
    "hermes": parse_hermes, "qwen": parse_hermes,
    "llama3_json": parse_llama3_json, "llama": parse_llama3_json,
    "mistral": parse_mistral,
    "deepseek_v3": parse_deepseek_v3, "deepseek": parse_deepseek_v3,
    "harmony": parse_harmony, "gpt_oss": parse_harmony,
    "kimi_k2": parse_kimi_k2,
}

#: End-of-turn markers a sample may end with; they are not part of the turn's text. (Tokenizers usually mark
#: them special, but a byte-level tokenizer spells them out.) Harmony's ``<|call|>``/``<|return|>`` stay: its
#: parser reads them.
TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<｜end▁of▁sentence｜>", "<|endoftext|>")

#: Markers that end an assistant turn (harmony's ``<|end|>`` is not one: it ends a message inside a turn).
TURN_STOPS = (*TURN_ENDS, "<|call|>", "<|return|>")

#: (markup a chat template renders, the parser for it), most specific first.
_SIGNATURES = [
    ("<|call|>", "harmony"),
    (_KIMI_SECTION, "kimi_k2"),
    (_DS_CALLS_BEGIN, "deepseek_v3"),
    (_MISTRAL_CALLS, "mistral"),
    ("<tool_call>", "hermes"),
    (_PYTHON_TAG, "llama3_json"),
    ('"parameters": ', "llama3_json"),
]


def detect(chat_template: str) -> str:
    """The parser for the tool-call markup found in ``chat_template``; ``"hermes"`` when none is found."""
    for markup, name in _SIGNATURES:
        if markup in chat_template:
            return name
    return "hermes"
