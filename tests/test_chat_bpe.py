"""ChatRenderer on a real byte-level BPE tokenizer (Qwen2/Qwen3's vocabulary, tests/qwen_bpe.py) with a Qwen3-style
template (tests/chat_templates.py).

Here decode→encode does not round-trip: markup merges with the sampled text before it (``'"}}\\n'``), one text has
many token spellings, and the tokenizer normalises to NFC. Whatever the model sampled stays verbatim in the
context; none of these is template drift, none raises under ``strict``; a real template difference still is.
"""

import json
import unicodedata

import pytest

from forge_env.chat import ChatRenderer, NonPrefixPreservingTemplateError
from forge_env.types import tool_message, user_message
from tests import chat_templates as T
from tests.qwen_bpe import qwen_tokenizer

CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "17*3"}}\n</tool_call>'
OPENING = [user_message("What is 17*3?")]
REPLY = [tool_message("51", "c1", "calc")]


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer(T.QWEN3)


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def one(tokenizer, text):
    ids = encode(tokenizer, text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def step(renderer, held, messages, sampled, replies, tools=(CALC,)):
    """Append a sampled turn and the env's reply the way the rollout does; return (held, messages, drift, parse)."""
    tools = list(tools)
    start = len(held)
    held = held + list(sampled)
    held += renderer.render_continuation(held, replies, tools)
    assert held[start:start + len(sampled)] == list(sampled)  # sampled ids stay verbatim
    text = renderer.decode_assistant(sampled)
    messages = [*messages, {"role": "assistant", "content": text}, *replies]
    return held, messages, renderer.check_drift(held, messages, tools), renderer.parse(text)


def calls(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


def test_the_tokenizer_is_qwens(tokenizer):
    assert len(tokenizer) == 151669
    assert encode(tokenizer, "<|im_start|>user\nHello world<|im_end|>") == [151644, 872, 198, 9707, 1879, 151645]
    assert [tokenizer.convert_ids_to_tokens(i) for i in (151643, 151657, 151658, 151667, 151668)] == [
        "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
    assert tokenizer.decode(encode(tokenizer, CALL)[-2:]) == '"}}\n</tool_call>'  # the newline merges into the JSON
    assert encode(tokenizer, "e\u0301") == encode(tokenizer, "é")  # NFC before encoding


@pytest.mark.parametrize("stop", ["<|im_end|>", "</tool_call>", "<|endoftext|>"])
def test_a_call_turn_is_closed_once_whatever_it_stopped_on(tokenizer, stop):
    # "\n</tool_call><|im_end|>\n" encodes on its own as ["\n", "</tool_call>", ...], but in the sampled turn
    # the "\n" is inside '"}}\n': matching tokens found no ending and appended the whole markup again.
    renderer = ChatRenderer(tokenizer, strict=True)
    sampled = encode(tokenizer, CALL + ("<|im_end|>" if stop == "<|im_end|>" else ""))
    if stop == "<|endoftext|>":
        sampled.append(one(tokenizer, stop))
    held = renderer.render_prompt(OPENING, [CALC])
    added = renderer.render_continuation(held + sampled, REPLY, [CALC])
    expected = "\n<|im_start|>user" if stop == "<|im_end|>" else "<|im_end|>\n<|im_start|>user"
    assert tokenizer.decode(added).startswith(expected)
    held, _, drift, parsed = step(renderer, held, OPENING, sampled, REPLY)
    assert calls(parsed) == [("calc", {"expression": "17*3"})] and not parsed.errors
    assert drift is None if stop != "<|endoftext|>" else drift.kind == "control_token"
    assert renderer.stats["non_prefix_preserving"] == 0 and renderer.stats["closed_turns"] == 0


def test_non_canonical_splits_are_not_drift(tokenizer):
    renderer = ChatRenderer(tokenizer, strict=True)
    paris = encode(tokenizer, "The capital is") + [one(tokenizer, " Par"), one(tokenizer, "is")] + encode(tokenizer, ".")
    assert tokenizer.decode(paris) == "The capital is Paris." and paris != encode(tokenizer, "The capital is Paris.")
    held = renderer.render_prompt(OPENING, [CALC])
    held, messages, drift, _ = step(renderer, held, OPENING, paris + [one(tokenizer, "<|im_end|>")],
                                    [user_message("Now compute 17*3.")])
    assert drift is None
    # a call spelled one character at a time, tags included; only the stop token is the real one
    spelled = [i for ch in CALL for i in encode(tokenizer, ch)] + [one(tokenizer, "<|im_end|>")]
    assert len(spelled) == len(CALL) + 1
    held, messages, drift, parsed = step(renderer, held, messages, spelled, [tool_message("51", "c2", "calc")])
    assert drift is None and calls(parsed) == [("calc", {"expression": "17*3"})]
    assert renderer.stats["non_prefix_preserving"] == 0 and renderer.stats["closed_turns"] == 0
    assert renderer.stats["retokenized"] == 2  # same text, other ids: counted apart from drift


@pytest.mark.parametrize("text", ["The answer is 51.  \n\n", "\nThe answer is 51.", "Trailing tab\t"])
def test_whitespace_at_either_end_of_a_reply_is_not_drift(tokenizer, text):
    renderer = ChatRenderer(tokenizer, strict=True)
    held = renderer.render_prompt(OPENING)
    sampled = encode(tokenizer, text) + [one(tokenizer, "<|im_end|>")]
    _, _, drift, parsed = step(renderer, held, OPENING, sampled, [user_message("Thanks.")], tools=())
    assert drift is None and parsed.content == text.strip()


def test_an_incomplete_utf8_sequence_at_the_end_of_a_turn_is_not_drift(tokenizer):
    renderer = ChatRenderer(tokenizer, strict=True)
    byte_c3 = tokenizer.convert_tokens_to_ids("Ã")  # the first byte of "é" (the byte-level alphabet's 'Ã')
    assert tokenizer.decode([byte_c3]) == "\ufffd"
    for closed in (True, False):  # stopped on <|im_end|>, or closed by the renderer
        held = renderer.render_prompt(OPENING)
        sampled = encode(tokenizer, "Voil") + [byte_c3] + ([one(tokenizer, "<|im_end|>")] if closed else [])
        _, _, drift, parsed = step(renderer, held, OPENING, sampled, [user_message("Again?")], tools=())
        assert drift is None and parsed.content == "Voil\ufffd"


def test_a_token_that_nfc_rewrites_is_not_drift(tokenizer):
    # ' và' sampled as Qwen's token 139607 (a + combining grave): the server's tokenizer reads it back as NFC.
    decomposed = 139607
    text = tokenizer.decode([decomposed])
    assert unicodedata.normalize("NFC", text) != text and encode(tokenizer, text) != [decomposed]
    renderer = ChatRenderer(tokenizer, strict=True)
    held = renderer.render_prompt(OPENING)
    sampled = encode(tokenizer, "Tôi") + [decomposed] + encode(tokenizer, " bạn") + [one(tokenizer, "<|im_end|>")]
    _, _, drift, _ = step(renderer, held, OPENING, sampled, [user_message("Again?")], tools=())
    assert drift is None and renderer.stats["retokenized"] == 1


def test_qwen3_reasoning_is_kept_in_a_tool_loop_and_re_rendered_after_it(tokenizer):
    thought = "<think>\nI should use the tool.\n</think>\n\n"
    for mode in ("keep", "rerender"):
        renderer = ChatRenderer(tokenizer, strict=True, reasoning=mode)
        held = renderer.render_prompt(OPENING, [CALC])
        sampled = encode(tokenizer, thought + CALL + "<|im_end|>")
        held, messages, drift, parsed = step(renderer, held, OPENING, sampled, REPLY)
        assert drift is None  # within the tool loop the template keeps the reasoning: token-exact
        assert parsed.reasoning == "I should use the tool." and calls(parsed) == [("calc", {"expression": "17*3"})]
        final = encode(tokenizer, "<think>\n51 it is.\n</think>\n\nIt is 51.<|im_end|>")
        held, messages, drift, parsed = step(renderer, held, messages, final, [user_message("And 2*2?")])
        assert drift.kind == "reasoning_dropped" and parsed.content == "It is 51."  # declared: strict is fine
        if mode == "rerender":  # the rollout's new segment: exactly the template's render, reasoning dropped
            segment = renderer.rerender(messages, [CALC])
            second = encode(tokenizer, "<think>\nEasy.\n</think>\n\n4<|im_end|>")
            _, _, drift, _ = step(renderer, segment, messages, second, [user_message("Bye.")])
            assert drift.kind == "reasoning_dropped"  # the 4's reasoning, dropped in turn; nothing else differs
        assert renderer.stats["non_prefix_preserving"] == 0


def test_a_real_template_difference_is_still_reported(tokenizer):
    compact = CALL.replace('{"name": "calc", "arguments": {"expression": "17*3"}}',
                           '{"name":"calc","arguments":{"expression":"17*3"}}')
    renderer = ChatRenderer(tokenizer, strict=True)
    held = renderer.render_prompt(OPENING, [CALC])
    with pytest.raises(NonPrefixPreservingTemplateError, match='"calc","arguments"'):
        step(renderer, held, OPENING, encode(tokenizer, compact + "<|im_end|>"), REPLY)
    assert renderer.stats["non_prefix_preserving"] == 1



def test_the_renderers_direct_rust_encoding_equals_the_tokenizers_own():
    """``ChatRenderer`` encodes with the Rust tokenizer itself when the transformers wrapper would change nothing;
    the ids are the wrapper's, and with truncation set on the Rust side it goes through the wrapper."""
    tokenizer = qwen_tokenizer()
    renderer = ChatRenderer(tokenizer, chat_template=T.QWEN3)
    texts = ["<|im_start|>user\nCafé ｶﾌｪ 12345 \u212b<|im_end|>\n", '<tool_call>\n{"a": 1}\n</tool_call>', "", "  x\r\n"]
    for text in texts:
        assert renderer._encode(text) == list(tokenizer(text, add_special_tokens=False)["input_ids"])
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(3)
    try:  # (the renderer first: the wrapper's call clears the truncation it does not ask for)
        assert renderer._encode(texts[0]) == list(tokenizer(texts[0], add_special_tokens=False)["input_ids"])
    finally:
        backend.no_truncation()
