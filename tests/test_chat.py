"""ChatRenderer: full rendering equals apply_chat_template; incremental rendering equals full rendering."""

import json

import pytest

from forge_env.chat import ChatRenderer, NonPrefixPreservingTemplateError, NonPrefixPreservingTemplateWarning
from forge_env.chat_endings import Ending, missing_ending
from forge_env.generation import HFGenerator, SamplingParams
from forge_env.models import build_byte_tokenizer, build_tiny_model
from forge_env.types import assistant_message, make_tool_call, system_message, tool_message, user_message

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

# Qwen3-like: the last assistant turn shows an (empty) think block, earlier ones do not.
NOT_PREFIX_PRESERVING = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and loop.last -%}{{- '<|im_start|>assistant\\n<think></think>' + m.content + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def episode():
    """An agentic episode: (messages before the first turn, [(assistant turn, env reply messages), ...])."""
    first = make_tool_call("calc", {"expression": "17*3"}, call_id="c1")
    second = make_tool_call("calc", {"expression": "51+4"}, call_id="c2")
    third = make_tool_call("calc", {"expression": "1/0"}, call_id="c3")
    return [system_message("Use the tool."), user_message("What is 17*3+4?")], [
        (assistant_message("Let me compute.", [first]), [tool_message("51", "c1", "calc")]),
        (
            assistant_message("", [second, third]),
            [tool_message("55", "c2", "calc"), tool_message("error", "c3", "calc")],
        ),
        (assistant_message("The answer is 55."), [user_message("Thanks! And 2*2?")]),
    ]


def sampled_ids(renderer, message, tools):
    """What a model that writes exactly the template's assistant turn samples: content + end-of-turn token."""
    text = renderer.render_text([message], tools)
    header = "<|im_start|>assistant\n"
    content = text[text.rindex(header) + len(header) : text.rindex("<|im_end|>")]
    return renderer.tokenizer(content + "<|im_end|>", add_special_tokens=False)["input_ids"]


def test_render_prompt_equals_apply_chat_template(tokenizer):
    renderer = ChatRenderer(tokenizer)
    start, turns = episode()
    messages = start + [m for turn, replies in turns for m in (turn, *replies)]
    expected = tokenizer.apply_chat_template(messages, tools=[CALC], add_generation_prompt=True)["input_ids"]
    assert renderer.render_prompt(messages, [CALC]) == expected
    assert renderer.render(start) == tokenizer.apply_chat_template(start)["input_ids"]


@pytest.mark.parametrize("tools", [[CALC], None])
def test_incremental_rendering_equals_full_rendering(tokenizer, tools):
    renderer = ChatRenderer(tokenizer)
    start, turns = episode()
    messages = list(start)
    token_ids = renderer.render_prompt(messages, tools)
    for assistant, replies in turns:
        token_ids += sampled_ids(renderer, assistant, tools)
        before = list(token_ids)
        token_ids += renderer.render_continuation(token_ids, replies, tools)
        messages += [assistant, *replies]
        assert token_ids[: len(before)] == before
        assert token_ids == renderer.render(messages, tools, add_generation_prompt=True)
    assert renderer.stats["non_prefix_preserving"] == 0 and renderer.stats["closed_turns"] == 0


def test_a_turn_cut_short_is_closed_by_the_template_markup(tokenizer):
    renderer = ChatRenderer(tokenizer)
    prompt = renderer.render_prompt([user_message("hi")])
    cut = tokenizer("I was cut", add_special_tokens=False)["input_ids"]
    added = renderer.render_continuation(prompt + cut, [user_message("go on")])
    full = renderer.render(
        [user_message("hi"), assistant_message("I was cut"), user_message("go on")],
        add_generation_prompt=True,
    )
    assert prompt + cut + added == full
    assert renderer.stats["closed_turns"] == 1


def test_a_dropped_think_block_is_reported_as_reasoning_and_the_tokens_kept(tokenizer):
    renderer = ChatRenderer(tokenizer, chat_template=NOT_PREFIX_PRESERVING)
    prompt = renderer.render_prompt([user_message("hi")])
    sampled = tokenizer("<think></think>hello<|im_end|>", add_special_tokens=False)["input_ids"]
    added = renderer.render_continuation(prompt + sampled, [user_message("more")])
    assert tokenizer.decode(added) == "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    messages = [user_message("hi"), {"role": "assistant", "content": renderer.decode_assistant(sampled)},
                user_message("more")]
    drift = renderer.check_drift(prompt + sampled + added, messages)
    assert drift is not None and drift.kind == "reasoning_dropped" and drift.held.startswith("<think>")
    assert renderer.stats["reasoning_dropped"] == 1 and renderer.stats["non_prefix_preserving"] == 0
    # keeping the sampled reasoning is the declared choice: strict does not raise for it
    strict = ChatRenderer(tokenizer, chat_template=NOT_PREFIX_PRESERVING, strict=True)
    assert strict.check_drift(prompt + sampled + added, messages).kind == "reasoning_dropped"


def test_any_other_re_rendering_warns_once_and_strict_raises(tokenizer):
    moves_system = (  # the system prompt is rendered inside the last user turn (as Mistral-Nemo does)
        "{%- set sys = messages[0].content if messages[0].role == 'system' else '' -%}"
        "{%- set ns = namespace(last=-1) -%}{%- for m in messages -%}{%- if m.role == 'user' -%}"
        "{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
        "{%- for m in messages -%}{%- if m.role == 'user' -%}"
        "{{- '<|im_start|>user\\n' + (sys + ' ' if loop.index0 == ns.last and sys else '') + m.content + '<|im_end|>\\n' -}}"
        "{%- elif m.role == 'assistant' -%}{{- '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    opening = [system_message("Be brief."), user_message("hi")]
    for strict in (False, True):
        renderer = ChatRenderer(tokenizer, chat_template=moves_system, strict=strict)
        held = renderer.render_prompt(opening)
        sampled = tokenizer("hello<|im_end|>", add_special_tokens=False)["input_ids"]
        held += sampled
        held += renderer.render_continuation(held, [user_message("more")])
        messages = [*opening, assistant_message("hello"), user_message("more")]
        if strict:
            with pytest.raises(NonPrefixPreservingTemplateError, match="strict=False"):
                renderer.check_drift(held, messages)
            continue
        with pytest.warns(NonPrefixPreservingTemplateWarning, match="re-renders earlier turns"):
            drift = renderer.check_drift(held, messages)
        assert drift.kind == "rerendered" and drift.held.startswith("Be brief.")
        assert renderer.stats["non_prefix_preserving"] == 1


def test_parse_assistant_uses_the_hermes_parser(tokenizer):
    renderer = ChatRenderer(tokenizer)
    ids = tokenizer(
        'ok<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call><|im_end|>'
    )["input_ids"]
    text = renderer.decode_assistant(ids)
    assert text == 'ok<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'
    message = renderer.parse_assistant(text)
    assert message["content"] == "ok"
    assert message["tool_calls"][0]["function"]["name"] == "calc"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"expression": "2+3"}
    assert renderer.parse("<tool_call>{oops</tool_call>").errors


def test_errors_are_specific(tokenizer):
    renderer = ChatRenderer(tokenizer)
    with pytest.raises(ValueError, match="at least one new message"):
        renderer.render_continuation([1, 2], [])
    bare = build_byte_tokenizer(chat_template=None)
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatRenderer(bare)


async def test_rendered_episode_reuses_the_whole_previous_turn(tokenizer):
    renderer = ChatRenderer(tokenizer)
    generator = HFGenerator(build_tiny_model(0), tokenizer)
    try:
        token_ids = renderer.render_prompt([user_message("What is 2+3?")], [CALC])
        previous_length = 0
        for turn in range(3):
            completion = await generator.generate(
                token_ids, SamplingParams(max_tokens=12, seed=turn), session_id="e"
            )
            assert completion.num_cached_tokens == previous_length
            token_ids = token_ids + completion.token_ids
            previous_length = len(token_ids)
            token_ids += renderer.render_continuation(
                token_ids, [tool_message(str(turn), f"c{turn}", "calc")], [CALC]
            )
    finally:
        generator.close()


def test_whitespace_the_model_wrote_before_a_call_is_not_drift(tokenizer):
    # The parser strips "Let me compute. " but the template renders content and call adjacent: the content
    # form whose rendering holds the sampled text is the one a server would hold.
    renderer = ChatRenderer(tokenizer)
    opening = [user_message("What is 17*3?")]
    held = renderer.render_prompt(opening, [CALC])
    text = 'Let me compute. <tool_call>{"name": "calc", "arguments": {"expression": "17*3"}}</tool_call>'
    sampled = tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
    reply = [tool_message("51", "c1", "calc")]
    held += sampled
    held += renderer.render_continuation(held, reply, [CALC])
    assert renderer.check_drift(held, [*opening, {"role": "assistant", "content": text}, *reply], [CALC]) is None
    # JSON the template would write differently is a real difference, and reported
    other = text.replace('{"name": "calc"', '{"name":"calc"')
    held2 = renderer.render_prompt(opening, [CALC]) + tokenizer(other + "<|im_end|>", add_special_tokens=False)["input_ids"]
    held2 += renderer.render_continuation(held2, reply, [CALC])
    with pytest.warns(NonPrefixPreservingTemplateWarning):
        drift = renderer.check_drift(held2, [*opening, {"role": "assistant", "content": other}, *reply], [CALC])
    assert drift is not None and '{"name":"calc"' in drift.held and '{"name": "calc"' in drift.rendered


# The second: a random tiny model sampled two control tokens in a row and stopped; cutting one of them left
# the other, and the turn was reported as template drift.
@pytest.mark.parametrize("sample", ["ok<|endoftext|><|im_end|>", "ok<|pad|><|endoftext|>"])
def test_control_tokens_sampled_inside_a_turn_are_recorded_as_the_sample_s_doing(tokenizer, sample):
    renderer = ChatRenderer(tokenizer, strict=True)
    held = renderer.render_prompt([user_message("hi")])
    sampled = tokenizer(sample, add_special_tokens=False)["input_ids"]
    held += sampled
    held += renderer.render_continuation(held, [user_message("more")])
    text = renderer.decode_assistant(sampled)
    assert text == "ok"
    drift = renderer.check_drift(held, [user_message("hi"), assistant_message(text), user_message("more")])
    assert drift is not None and drift.kind == "control_token" and renderer.stats["non_prefix_preserving"] == 0


def test_a_call_turn_that_stops_on_endoftext_is_closed_without_repeating_its_markup(tokenizer):
    # The sample ends "</tool_call><|endoftext|>": the control token is not part of the template's ending, so
    # the turn already holds "</tool_call>" and only "<|im_end|>\n" is missing (not "</tool_call><|im_end|>\n").
    renderer = ChatRenderer(tokenizer, strict=True)
    opening = [user_message("What is 17*3?")]
    held = renderer.render_prompt(opening, [CALC])
    text = '<tool_call>{"name": "calc", "arguments": {"expression": "17*3"}}</tool_call>'
    sampled = tokenizer(text + "<|endoftext|>", add_special_tokens=False)["input_ids"]
    reply = [tool_message("51", "c1", "calc")]
    held += sampled
    added = renderer.render_continuation(held, reply, [CALC])
    assert tokenizer.decode(added) == "<|im_end|>\n<|im_start|>user\n<tool_response>51</tool_response><|im_end|>\n" \
                                      "<|im_start|>assistant\n"
    assert renderer.stats["closed_turns"] == 0
    held += added
    assert renderer.decode_assistant(sampled) == text
    drift = renderer.check_drift(held, [*opening, {"role": "assistant", "content": text}, *reply], [CALC])
    assert drift is not None and drift.kind == "control_token"  # the sample's token, not the template's doing
    assert renderer.stats["non_prefix_preserving"] == 0


def test_endings_are_matched_only_at_their_own_token_boundaries(tokenizer):
    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=False)

    im_end = Ending.of("<|im_end|>\n", encode, decode)
    # "<|im_" spelled in bytes is not the start of the <|im_end|> token: the whole ending follows it
    missing, cut = missing_ending(encode("ok<|im_"), [im_end], decode, set())
    assert decode(missing) == "<|im_end|>\n" and cut and len(missing) == 2
    missing, cut = missing_ending(encode("ok<|im_end|>"), [im_end], decode, set())
    assert decode(missing) == "\n" and not cut
    # a byte-level multi-byte character is never split: "<｜" produced, the rest of the marker appended whole
    eos = Ending.of("<｜end▁of▁sentence｜>", encode, decode)
    for sample in ("hi<｜", "hi<｜end", "hi<"):
        missing, cut = missing_ending(encode(sample), [eos], decode, set())
        assert decode(encode(sample) + missing) == "hi<｜end▁of▁sentence｜>" and not cut
