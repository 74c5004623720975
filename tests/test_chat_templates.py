"""Token-exact or reported, per model family: multi-turn tool conversations through ChatRenderer with a
template written for the test that reproduces each family's re-rendering behaviour (tests/chat_templates.py).

A scripted "model" writes each assistant turn exactly as the family's template renders it (reasoning,
content, the family's tool-call format, its stop marker); the renderer appends only the env's replies, and
after every reply the whole token list is compared with a full re-render of the conversation.
"""

import json

import pytest

from agents.trajectory import Trajectory, Turn
from forge_env.chat import ChatRenderer, NonPrefixPreservingTemplateError
from forge_env.models import build_byte_tokenizer
from forge_env.tools import parse_tool_calls
from forge_env.types import make_tool_call, system_message, tool_message, user_message
from tests import chat_templates as T

# Drift is what these tests provoke; the warning is asserted in tests/test_chat.py.
pytestmark = pytest.mark.filterwarnings("ignore::forge_env.chat.NonPrefixPreservingTemplateWarning")

CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}

# family: (template, parser it must be detected as, stop markers the model ends a turn with, writes reasoning)
FAMILIES = {
    "qwen3": (T.QWEN3, "hermes", ["<|im_end|>"], True),
    "deepseek_r1": (T.DEEPSEEK_R1, "deepseek_v3", ["<｜end▁of▁sentence｜>"], True),
    "mistral_nemo": (T.MISTRAL_NEMO, "mistral", ["</s>"], False),
    "hermes3": (T.HERMES3, "hermes", ["<|im_end|>"], False),
    "gpt_oss": (T.GPT_OSS, "harmony", ["<|call|>", "<|return|>"], True),
    "llama31": (T.LLAMA31, "llama3_json", ["<|eot_id|>"], False),
    "deepseek_v31": (T.DEEPSEEK_V31, "deepseek_v3", ["<｜end▁of▁sentence｜>"], False),
    "kimi_k2": (T.KIMI_K2, "kimi_k2", ["<|im_end|>"], False),
    # written after the published templates, rule for rule (tests/chat_templates.py)
    "deepseek_v31_hub": (T.DEEPSEEK_V31_HUB, "deepseek_v3", ["<｜end▁of▁sentence｜>"], False),
    "gpt_oss_hub": (T.GPT_OSS_HUB, "harmony", ["<|call|>", "<|return|>"], True),
    "mistral_nemo_hub": (T.MISTRAL_NEMO_HUB, "mistral", ["</s>"], False),
}

# What a full re-render of the 4-turn episode below must report, per family: (turn, where, kind) of each
# recorded divergence. Everything else is token-exact.
EXPECTED = {
    "qwen3": [(0, "sampled", "reasoning_dropped")],         # earlier reasoning dropped once a user turn follows
    "deepseek_r1": [(0, "context", "reasoning_dropped")],   # every earlier turn loses the prompt's <think> + reasoning
    "mistral_nemo": [(0, "context", "rerendered")],         # the system prompt moves to the last user message
    "hermes3": [(1, "context", "rerendered")],              # the tool response re-renders once not last
    "gpt_oss": [(2, "sampled", "reasoning_dropped")],       # an earlier final answer loses its analysis
    "llama31": [], "deepseek_v31": [], "kimi_k2": [],
    "deepseek_v31_hub": [],                                 # string arguments, no header after a tool output
    "gpt_oss_hub": [(0, "sampled", "reasoning_dropped")],   # a call's analysis goes once a final answer follows
    "mistral_nemo_hub": [(0, "context", "rerendered"),      # the system prompt stays only while its user is last
                         (0, "context", "rerendered")],     # the tool list moves to the new last user message
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def call(family, expression, index):
    call_id = f"functions.calc:{index}" if family == "kimi_k2" else f"c{index}x7k2m9a"  # Mistral: 9 characters
    return make_tool_call("calc", {"expression": expression}, call_id=call_id)


def script(family, reasoning):
    """(opening messages, [(assistant message as the model means it, the env's reply), ...])."""
    think = (lambda text: {"reasoning_content": text, "thinking": text}) if reasoning else (lambda text: {})
    c1, c2, c3 = call(family, "17*3", 0), call(family, "51+4", 1), call(family, "2*2", 2)
    return [system_message("Use the tool."), user_message("What is 17*3+4?")], [
        ({"role": "assistant", "content": "", "tool_calls": [c1], **think("First 17*3.")},
         [tool_message("51", c1["id"], "calc")]),
        ({"role": "assistant", "content": "", "tool_calls": [c2], **think("Now add 4.")},
         [tool_message("55", c2["id"], "calc")]),
        ({"role": "assistant", "content": "The answer is 55.", **think("Done.")}, [user_message("And 2*2?")]),
        ({"role": "assistant", "content": "", "tool_calls": [c3], **think("Easy.")}, [tool_message("4", c3["id"], "calc")]),
    ]


def as_template_args(message):
    """The message with object arguments, as templates render them."""
    if not message.get("tool_calls"):
        return message
    calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def sample_text(family, renderer, history, message, stops):
    """The text a model of this family writes for ``message`` after the generation prompt."""
    prompt = renderer.render_text(history, [CALC], add_generation_prompt=True)
    if family == "deepseek_r1":  # the prompt opens <think>; the template strips reasoning from every turn
        plain = renderer.render_text([*history, as_template_args(message)], [CALC])
        turn = plain[len(prompt) - len("<think>\n"):]
        turn = message["reasoning_content"] + "\n</think>\n\n" + turn
    else:
        full = renderer.render_text([*history, as_template_args(message)], [CALC])
        if full.startswith(prompt):
            turn = full[len(prompt):]
        else:  # the template re-rendered history: render the turn after a bare user message instead
            bare = [user_message("x")]
            alone = renderer.render_text([*bare, as_template_args(message)], [CALC])
            turn = alone[len(renderer.render_text(bare, [CALC], add_generation_prompt=True)):]
    end = max(turn.rfind(stop) + len(stop) for stop in stops if stop in turn)
    return turn[:end]


def play(family, tokenizer, **renderer_kw):
    """Play the scripted episode the way the rollout does; return the renderer, the trajectory (token list,
    turn spans, drift records) and the parsed turns."""
    template, _, stops, reasoning = FAMILIES[family]
    renderer = ChatRenderer(tokenizer, chat_template=template, **renderer_kw)
    opening, turns = script(family, reasoning)
    history = list(opening)      # as the model means it (structured), for writing its turns
    trajectory = Trajectory(episode_id=family, messages=list(opening))  # as the rollout holds it (raw text)
    trajectory.append_context(renderer.render_prompt(opening, [CALC]))
    assert trajectory.token_ids == renderer.render(opening, [CALC], add_generation_prompt=True)
    parsed = []
    for message, replies in turns:
        text = sample_text(family, renderer, history, message, stops)
        sampled = tokenizer(text, add_special_tokens=False)["input_ids"]
        start = len(trajectory.token_ids)
        trajectory.append_sampled(sampled, [0.0] * len(sampled))
        trajectory.turns.append(Turn(prompt_start=0, gen_start=start, gen_end=len(trajectory.token_ids),
                                     policy_version=0, finish_reason="stop"))
        raw = renderer.decode_assistant(sampled)
        parsed.append(renderer.parse(raw))
        trajectory.append_context(renderer.render_continuation(trajectory.token_ids, replies, [CALC]))
        history += [message, *replies]
        trajectory.messages += [{"role": "assistant", "content": raw}, *replies]
        drift = renderer.check_drift(trajectory.token_ids, trajectory.messages, [CALC])
        if drift is not None:
            trajectory.record_drift(drift)
    return renderer, trajectory, parsed, turns, history


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_detected_parser_reads_what_the_template_renders(family, tokenizer):
    template, parser, _, reasoning = FAMILIES[family]
    renderer, _, parsed, turns, _ = play(family, tokenizer)
    assert renderer.parser == parser
    for action, (message, _) in zip(parsed, turns, strict=True):
        assert action.errors == []
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in action.tool_calls]
        want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
        assert got == want
        assert action.content == message["content"]
        assert action.reasoning == (message.get("reasoning_content") if reasoning else None)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_re_rendering_is_reported_and_nothing_else(family, tokenizer):
    renderer, trajectory, _, _, history = play(family, tokenizer)
    assert [(r["turn"], r["where"], r["kind"]) for r in trajectory.drift] == EXPECTED[family]
    exact = trajectory.token_ids == renderer.render([as_template_args(m) for m in history], [CALC],
                                                    add_generation_prompt=True)
    assert exact == (not EXPECTED[family])
    assert renderer.stats["closed_turns"] == 0
    trajectory.check()  # the sampled tokens are verbatim and masked exactly


def test_qwen3_tool_loop_is_exact_even_when_strict(tokenizer):
    # The false alarm of the one-turn probe: a Qwen3 tool loop is token-exact and strict must not raise.
    renderer = ChatRenderer(tokenizer, chat_template=T.QWEN3, strict=True)
    opening, turns = script("qwen3", True)
    history, episode = list(opening), list(opening)
    held = renderer.render_prompt(opening, [CALC])
    for message, replies in turns[:2]:
        text = sample_text("qwen3", renderer, history, message, ["<|im_end|>"])
        sampled = tokenizer(text, add_special_tokens=False)["input_ids"]
        held += sampled
        held += renderer.render_continuation(held, replies, [CALC])
        history += [message, *replies]
        episode += [{"role": "assistant", "content": renderer.decode_assistant(sampled)}, *replies]
        assert renderer.check_drift(held, episode, [CALC]) is None
    assert renderer.stats["non_prefix_preserving"] == 0 and renderer.stats["drift_checks"] == 2


def test_strict_raises_on_a_template_that_rewrites_history(tokenizer):
    with pytest.raises(NonPrefixPreservingTemplateError, match="re-renders earlier turns"):
        play("hermes3", tokenizer, strict=True)
    # reasoning kept by choice is not an error under strict
    _, trajectory, _, _, _ = play("deepseek_r1", tokenizer, strict=True)
    assert trajectory.drift and all(d["kind"] == "reasoning_dropped" for d in trajectory.drift)


def test_gpt_oss_return_becomes_end_in_history_and_is_reported(tokenizer):
    renderer = ChatRenderer(tokenizer, chat_template=T.GPT_OSS)
    opening = [user_message("Hi")]
    held = renderer.render_prompt(opening)
    sampled = tokenizer("<|channel|>final<|message|>Hello.<|return|>", add_special_tokens=False)["input_ids"]
    held += sampled
    held += renderer.render_continuation(held, [user_message("Again")])
    episode = [*opening, {"role": "assistant", "content": renderer.decode_assistant(sampled)}, user_message("Again")]
    drift = renderer.check_drift(held, episode)
    assert drift is not None and drift.kind == "rerendered"
    assert drift.held.startswith("return|>") and drift.rendered.startswith("end|>")


# ----------------------------------------------------------------------------- published templates, one by one

def _tool_step(renderer, tokenizer, opening, sampled_text, replies, tools=(CALC,)):
    """One sampled turn and the env's reply; returns (held, episode, drift, parsed)."""
    tools = list(tools)
    held = renderer.render_prompt(opening, tools)
    sampled = tokenizer(sampled_text, add_special_tokens=False)["input_ids"]
    held += sampled
    held += renderer.render_continuation(held, replies, tools)
    text = renderer.decode_assistant(sampled)
    episode = [*opening, {"role": "assistant", "content": text}, *replies]
    return held, episode, renderer.check_drift(held, episode, tools), renderer.parse(text)


def test_deepseek_v31_continues_after_a_call_although_it_concatenates_string_arguments(tokenizer):
    # The published template writes '<｜tool▁sep｜>' + arguments: the renderer's object arguments (its probe, and
    # the structured conversation of the drift check) raised "can only concatenate str (not "dict") to str".
    renderer = ChatRenderer(tokenizer, chat_template=T.DEEPSEEK_V31_HUB, strict=True)
    sampled = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calc<｜tool▁sep｜>{"expression": "17*3"}'
               '<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>')
    held, episode, drift, parsed = _tool_step(renderer, tokenizer, [user_message("What is 17*3?")], sampled,
                                              [tool_message("51", "c0x7k2m9a", "calc")])
    assert tokenizer.decode(held).endswith(sampled + "<｜tool▁output▁begin｜>51<｜tool▁output▁end｜>")  # no prompt
    assert drift is None and [c["function"]["name"] for c in parsed.tool_calls] == ["calc"]
    # a caller's own messages with object arguments render too
    call = {"id": "c0x7k2m9a", "type": "function", "function": {"name": "calc", "arguments": {"expression": "1+1"}}}
    assert '<｜tool▁sep｜>{"expression": "1+1"}' in renderer.render_text(
        [user_message("q"), {"role": "assistant", "content": None, "tool_calls": [call]}])


def test_gpt_oss_calls_are_parsed_where_the_published_template_puts_the_recipient(tokenizer):
    # "<|start|>assistant to=functions.calc<|channel|>commentary json<|message|>…": the recipient runs into the
    # channel tag; the parser read the call as "calc<|channel|>commentary", and the drift check (re-rendering
    # that name) reported every token-exact call step, so strict refused a valid conversation.
    renderer = ChatRenderer(tokenizer, chat_template=T.GPT_OSS_HUB, strict=True)
    call = make_tool_call("calc", {"expression": "17*3"}, call_id="c0")
    rendered = renderer.render_text([user_message("q"), {"role": "assistant", "content": "", "tool_calls": [
        {**call, "function": {"name": "calc", "arguments": {"expression": "17*3"}}}], "thinking": "Use calc."}])
    turn = rendered[rendered.index("<|start|>assistant<|channel|>analysis") + len("<|start|>assistant"):]
    assert "to=functions.calc<|channel|>commentary json<|message|>" in turn
    parsed = parse_tool_calls(turn, "harmony")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        ("calc", {"expression": "17*3"})]
    assert parsed.reasoning == "Use calc." and parsed.errors == []
    # the other placement (recipient after the channel) still parses
    assert parse_tool_calls("<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{}<|call|>",
                            "harmony").tool_calls[0]["function"]["name"] == "calc"
    _, _, drift, _ = _tool_step(renderer, tokenizer, [user_message("What is 17*3?")], turn,
                                [tool_message("51", "c0", "calc")])
    assert drift is None and renderer.stats["non_prefix_preserving"] == 0


def test_mistral_nemo_tool_loop_is_exact_step_after_step_when_strict(tokenizer):
    # Without a system prompt and with the tool list before the only user message, nothing re-renders: every
    # step, the second included, is token-exact and strict does not raise.
    renderer = ChatRenderer(tokenizer, chat_template=T.MISTRAL_NEMO_HUB, strict=True)
    opening = [user_message("What is 17*3+4?")]
    held = renderer.render_prompt(opening, [CALC])
    episode = list(opening)
    for index, (expression, result) in enumerate([("17*3", "51"), ("51+4", "55")]):
        call_id = f"c{index}x7k2m9a"
        sampled = (f'[TOOL_CALLS][{{"name": "calc", "arguments": {{"expression": "{expression}"}}, '
                   f'"id": "{call_id}"}}]</s>')
        reply = [tool_message(result, call_id, "calc")]
        held += tokenizer(sampled, add_special_tokens=False)["input_ids"]
        held += renderer.render_continuation(held, reply, [CALC])
        episode += [{"role": "assistant", "content": sampled[:-len("</s>")]}, *reply]
        assert renderer.check_drift(held, episode, [CALC]) is None
    assert tokenizer.decode(held).endswith('[TOOL_RESULTS]{"content": 55, "call_id": "c1x7k2m9a"}[/TOOL_RESULTS]')
    assert renderer.stats["drift_checks"] == 2 and renderer.stats["closed_turns"] == 0
