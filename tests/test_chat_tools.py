"""Templates without tool support (forge_env.chat_tools): tool specs, calls and results moved into the messages,
token-exact against the tokenizer's own template over those messages. The real model's template is tested in
tests/test_real_model.py; these use the byte tokenizer with small templates."""

import pytest

from agents.eval.metrics import tool_calls
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


# ----------------------------------------------------------------------------------------------- trajectories


class Scripted:
    """A generator that returns the given turns in order (byte-tokenized), with the Generator contract."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns = tokenizer, list(turns)

    async def generate(self, prompt_ids, sampling, session_id=None):
        from forge_env.generation.base import Completion

        ids = encode(self.tokenizer, self.turns.pop(0))
        return Completion(prompt_ids=list(prompt_ids), token_ids=ids, logprobs=[-0.5] * len(ids), text="",
                          finish_reason="stop", policy_version=0)

    async def release_session(self, session_id):
        pass


@pytest.mark.parametrize("template", [PLAIN, STRICT_ROLES])
async def test_a_rollout_records_the_messages_the_template_saw(tokenizer, template):
    import forge_env
    from agents.rollout import EpisodeBudget, run_episode

    calc = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*46"}}\n</tool_call>'
    renderer = ChatRenderer(tokenizer, chat_template=template)
    policy = Scripted(tokenizer, [calc + "<|im_end|>", "138<|im_end|>"])
    trajectory = await run_episode(forge_env.make("forge_env/Arithmetic-v0"), policy, renderer, seed=1,
                                   budget=EpisodeBudget(max_turns=2))
    assert trajectory.ok and trajectory.reward == 1.0 and trajectory.drift == []
    shown = trajectory.messages
    assert shown[0]["role"] == "system" and "<tools>" in shown[0]["content"]
    assert shown[2] == {"role": "assistant", "content": calc} and shown[4] == {"role": "assistant", "content": "138"}
    if template == PLAIN:  # it renders the tool role: the env's tool message as it was
        assert shown[3]["role"] == "tool" and shown[3]["content"] == "138"
    else:
        assert shown[3] == {"role": "user", "content": "<tool_response>\n138\n</tool_response>"}
    assert tool_calls(trajectory) == 1  # eval's count finds the result either way
    # the tokenizer's own template over the recorded messages (no tools=) is the episode, up to the final newline
    rendered = encode(tokenizer, tokenizer.apply_chat_template(shown[:5], chat_template=template, tokenize=False))
    assert rendered == trajectory.token_ids + encode(tokenizer, "\n")


async def test_a_template_with_tool_support_keeps_the_envs_messages(tokenizer):
    import forge_env
    from agents.rollout import EpisodeBudget, run_episode

    env = forge_env.make("forge_env/Arithmetic-v0")
    opening = env.reset(seed=1)[0]
    trajectory = await run_episode(env, Scripted(tokenizer, ["138<|im_end|>"]), ChatRenderer(tokenizer), seed=1,
                                   budget=EpisodeBudget(max_turns=1))
    assert trajectory.messages[:2] == opening  # the system message is the env's: the tools go in tools=


async def test_the_gateway_records_each_segment_as_the_template_saw_it(tokenizer):
    from agents.gateway import HISTORY_EDITED, AgentGateway

    gateway = AgentGateway(Scripted(tokenizer, [CALL + "<|im_end|>", "It is 4<|im_end|>", "ok<|im_end|>"]),
                           ChatRenderer(tokenizer, chat_template=PLAIN))
    opening = [{"role": "user", "content": "2+2?"}]
    first = await gateway.chat("g", opening, tools=[TOOL])
    assert first.message["tool_calls"][0]["function"]["name"] == "calc"
    result = {"role": "tool", "tool_call_id": first.message["tool_calls"][0]["id"], "name": "calc", "content": "4"}
    history = [*opening, first.message, result]
    second = await gateway.chat("g", history, tools=[TOOL])
    # a history edit: the harness drops the tool exchange and asks again (a new segment, its own listing)
    await gateway.chat("g", [*opening, {"role": "user", "content": "just say ok"}], tools=[TOOL])
    trajectory = await gateway.finish("g")
    assert [d["kind"] for d in trajectory.drift] == [HISTORY_EDITED]
    offset = trajectory.drift[0]["messages_offset"]
    segments = [trajectory.messages[:offset], trajectory.messages[offset:]]
    bounds = [*trajectory.segment_starts, len(trajectory.token_ids)]
    for messages, start, end in zip(segments, bounds[:-1], bounds[1:], strict=True):
        assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
        rendered = tokenizer.apply_chat_template(messages, chat_template=PLAIN, tokenize=False)
        assert encode(tokenizer, rendered) == trajectory.token_ids[start:end] + encode(tokenizer, "\n")
    assert segments[0][2] == {"role": "assistant", "content": CALL} and segments[0][3]["role"] == "tool"
    assert segments[0][4] == {"role": "assistant", "content": second.text}
