"""Tool-call parsers: each family's format, reasoning never executed, and hostile text answered, never raised."""

import json
import random

import pytest

from forge_env import TextEnv, tool
from forge_env.chat import ChatRenderer
from forge_env.models import build_byte_tokenizer
from forge_env.tools import detect_parser, get_parser, parse_tool_calls, parser_names
from forge_env.tools.parsed import MAX_CALLS_PER_TURN
from tests import chat_templates as T

DEEP = '{"name": "add", "arguments": {"a": ' + "[" * 50_000 + "]" * 50_000 + "}}"
HUGE_INT = '{"name": "add", "arguments": {"a": ' + "9" * 5000 + ', "b": 1}}'

# One hostile call body per format (a dict of arguments is nested 50k deep, or holds a 5000-digit integer).
HOSTILE = {
    "hermes": lambda body: f"<tool_call>{body}</tool_call>",
    "llama3_json": lambda body: f"<|python_tag|>{body}",
    "mistral": lambda body: f"[TOOL_CALLS][{body}]",
    "deepseek_v3": lambda body: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
                                + body[body.index('{"a"'):-1] + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "harmony": lambda body: "<|channel|>commentary to=functions.add <|constrain|>json<|message|>"
                            + body[body.index('{"a"'):-1] + "<|call|>",
    "kimi_k2": lambda body: "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
                            + body[body.index('{"a"'):-1] + "<|tool_call_end|><|tool_calls_section_end|>",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("body", [DEEP, HUGE_INT], ids=["deep", "huge_int"])
def test_hostile_json_is_a_bounded_error_for_every_parser(name, body):
    parsed = parse_tool_calls(HOSTILE[name](body), name)
    assert parsed.tool_calls == []
    assert len(parsed.errors) == 1 and len(parsed.errors[0]) < 600
    assert "nested too deeply" in parsed.errors[0] or "out of range" in parsed.errors[0]


@pytest.mark.parametrize("name", parser_names())
def test_no_text_makes_a_parser_raise(name):
    fragments = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', ":", '"calc"', '"arguments"', ",",
                 "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                 "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<|channel|>", "<|message|>", "<|call|>", "to=functions.x",
                 "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                 "<think>", "</think>", "\n", "```json", "1e999", "9" * 40, "null", "x"]
    rng = random.Random(0)
    parser = get_parser(name)
    for _ in range(300):
        parsed = parser("".join(rng.choice(fragments) for _ in range(rng.randint(0, 30))))
        for call in parsed.tool_calls:
            assert isinstance(json.loads(call["function"]["arguments"]), dict)


def test_a_turn_with_too_many_calls_is_cut_with_an_error():
    text = "".join('<tool_call>{"name": "add", "arguments": {}}</tool_call>' for _ in range(MAX_CALLS_PER_TURN + 5))
    parsed = parse_tool_calls(text)
    assert len(parsed.tool_calls) == MAX_CALLS_PER_TURN and "more than" in parsed.errors[0]


def test_formats_beyond_the_template_tests():
    v11 = parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]add[ARGS]{"a": 2}', "mistral")
    assert [json.loads(c["function"]["arguments"]) for c in v11.tool_calls] == [{"a": 1}, {"a": 2}]
    several = parse_tool_calls('{"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"a": 2}}',
                               "llama3_json")
    assert len(several.tool_calls) == 2
    answer = parse_tool_calls('The set is {1, 2}.', "llama3_json")
    assert answer.content == "The set is {1, 2}." and not answer.tool_calls and not answer.errors
    bad = parse_tool_calls('<tool_call>{"name": "add", "arguments": [1]}</tool_call>')
    assert "must be a JSON object" in bad.errors[0]


def test_parser_detection_from_templates():
    assert detect_parser(build_byte_tokenizer().chat_template) == "hermes"
    assert {detect_parser(t) for t in (T.GPT_OSS, T.KIMI_K2, T.MISTRAL_NEMO, T.LLAMA31, T.DEEPSEEK_V31)} == {
        "harmony", "kimi_k2", "mistral", "llama3_json", "deepseek_v3"}
    assert ChatRenderer(build_byte_tokenizer(), chat_template=T.GPT_OSS).parser == "harmony"
    assert ChatRenderer(build_byte_tokenizer(), parser="kimi_k2").parser == "kimi_k2"
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_parser("nope")


# ----------------------------------------------------------------------------- through TextEnv.step

class CountingEnv(TextEnv):
    """An env whose one tool counts its executions."""

    def __init__(self, **kw):
        self.executed = []

        @tool
        def add(a: int, b: int = 0) -> int:
            """Add two numbers."""
            self.executed.append((a, b))
            return a + b

        super().__init__(tasks=[{"question": "q"}], tools=[add], **kw)


async def test_calls_written_inside_reasoning_are_never_executed():
    env = CountingEnv()
    await env.areset(seed=0)
    thought = '<think>maybe <tool_call>{"name": "add", "arguments": {"a": 666}}</tool_call> no</think>'
    obs, *_ = await env.astep(thought + '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert env.executed == [(1, 2)] and obs[0]["content"] == "3"
    assert env.state.messages[-2]["reasoning_content"].startswith("maybe")
    # an unclosed think block is all reasoning: nothing runs, and the turn is an (empty) answer
    env2 = CountingEnv()
    await env2.areset(seed=0)
    await env2.astep('<think>let me call <tool_call>{"name": "add", "arguments": {"a": 5}}</tool_call>')
    assert env2.executed == []


@pytest.mark.parametrize("body", [DEEP, HUGE_INT], ids=["deep", "huge_int"])
async def test_step_answers_hostile_tool_calls_with_an_error_observation(body):
    env = CountingEnv()
    await env.areset(seed=0)
    obs, reward, terminated, truncated, info = await env.astep(f"<tool_call>{body}</tool_call>")
    assert obs[0]["role"] == "user" and obs[0]["content"].startswith("Error:") and not terminated
    assert env.executed == []
    # the same arguments arriving pre-parsed in a message dict
    arguments = body[body.index('{"a"'):-1]
    obs, *_ = await env.astep({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": arguments}}]})
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error:")


def test_sync_step_with_a_raising_custom_parser_answers_with_an_error():
    def broken(text):
        raise RecursionError("parser bug")

    env = CountingEnv(tool_parser=broken)
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step("<tool_call>{}</tool_call>")
    assert "could not be parsed" in obs[0]["content"] and "RecursionError" in obs[0]["content"]
    assert info["errors"]
