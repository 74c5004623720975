"""Templates without tool support (forge_env.chat_tools): tool specs, calls and results moved into the messages,
token-exact against the tokenizer's own template over those messages. The real model's template is tested in
tests/test_real_model.py; these use the byte tokenizer with small templates."""

import pytest

from forge_env.chat import ChatRenderer
from forge_env.chat_tools import UnsupportedToolFormatError
from forge_env.models import build_byte_tokenizer

# SmolLM2-135M-Instruct's template: any role, a default system prompt, no tools.
PLAIN = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The same, refusing any role but system, user and assistant.
STRICT_ROLES = ("{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}"
                "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
                "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOL = {"type": "function", "function": {"name": "calc", "description": "math",
                                         "parameters": {"type": "object", "properties": {"e": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "calc", "arguments": {"e": "2+2"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def episode(renderer, tokenizer, opening):
    """A tool call answered by a tool result, then a final answer cut short and a user turn."""
    messages = list(opening)
    ids = renderer.render_prompt(messages, [TOOL])
    ids += encode(tokenizer, CALL + "<|im_end|>")
    messages.append({"role": "assistant", "content": CALL})
    result = [{"role": "tool", "content": "4", "tool_call_id": "call_0", "name": "calc"}]
    ids += renderer.render_continuation(ids, result, [TOOL])
    messages += result
    assert renderer.check_drift(ids, messages, [TOOL]) is None
    ids += encode(tokenizer, "It is 4")
    messages.append({"role": "assistant", "content": "It is 4"})
    ids += renderer.render_continuation(ids, [{"role": "user", "content": "ok"}], [TOOL])
    messages.append({"role": "user", "content": "ok"})
    assert renderer.check_drift(ids, messages, [TOOL]) is None
    return ids, messages


@pytest.mark.parametrize("template, tool_role", [(PLAIN, True), (STRICT_ROLES, False)])
def test_a_template_without_tools_renders_the_episode_its_own_way(tokenizer, template, tool_role):
    renderer = ChatRenderer(tokenizer, chat_template=template)
    assert (renderer.support.tools, renderer.support.calls, renderer.support.tool_role) == (False, False, tool_role)
    ids, messages = episode(renderer, tokenizer, [{"role": "user", "content": "2+2?"}])
    shown, tools = renderer.template_messages(messages, [TOOL])
    assert tools is None and shown[0]["role"] == "system" and '"name": "calc"' in shown[0]["content"]
    assert shown[3]["role"] == ("tool" if tool_role else "user")
    if not tool_role:
        assert shown[3]["content"] == "<tool_response>\n4\n</tool_response>"
    assert renderer.template_messages(shown, [TOOL])[0] == shown  # idempotent: one listing, not two
    reference = tokenizer.apply_chat_template(shown, chat_template=template, add_generation_prompt=True,
                                              tokenize=False)
    assert ids == encode(tokenizer, reference)
    assert renderer.stats["non_prefix_preserving"] == 0 and renderer.stats["closed_turns"] == 1


def test_structured_calls_are_written_into_the_content(tokenizer):
    renderer = ChatRenderer(tokenizer, chat_template=PLAIN)
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}
    shown, _ = renderer.template_messages(
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "", "tool_calls": [call]}], [TOOL])
    assert shown[2] == {"role": "assistant", "content": CALL}
    assert renderer.parse(shown[2]["content"]).tool_calls[0]["function"]["name"] == "calc"


def test_a_template_with_tool_support_is_left_alone(tokenizer):
    renderer = ChatRenderer(tokenizer)  # the tiny model's Qwen-style template
    assert (renderer.support.tools, renderer.support.calls, renderer.support.tool_role) == (True, True, True)
    messages = [{"role": "user", "content": "2+2?"}]
    assert renderer.template_messages(messages, [TOOL]) == (messages, [TOOL])


def test_a_tool_format_it_cannot_write_is_a_clear_error(tokenizer):
    renderer = ChatRenderer(tokenizer, chat_template=PLAIN, parser="mistral")
    with pytest.raises(UnsupportedToolFormatError, match="parser='hermes'"):
        renderer.render_prompt([{"role": "user", "content": "hi"}], [TOOL])
    assert renderer.render_prompt([{"role": "user", "content": "hi"}])  # without tools it renders as ever
