"""Control tokens a model samples inside its turns (``<|pad|>``, ``<|im_start|>``, ``<|endoftext|>``) are the sample's
doing, not template drift, wherever and however many they are: on the project's byte tokenizer and on the real
Qwen BPE vocabulary with the Qwen3 template. A real template difference after them is still reported, where it is.

The drift check compares the episode's tokens with a re-render of its messages, and a sampled turn's message is
its text with the control tokens dropped. Where the model sampled a control token between the bytes of one
UTF-8 character, the re-render joins those bytes into the character the episode holds as U+FFFD pieces; where
it sampled several, apart or in a row, each has to go. The gateway's test saw both from a random tiny model
(``<|pad|>...<|pad|>`` in one turn, ``\\xe2\\xab<|im_start|>\\x8f``) reported as template drift.
"""

import random

import pytest

from forge_env.chat import ChatRenderer, NonPrefixPreservingTemplateWarning
from forge_env.models import build_byte_tokenizer
from forge_env.types import user_message
from tests import chat_templates as T
from tests.qwen_bpe import qwen_tokenizer


@pytest.fixture(scope="module")
def byte_tokenizer():
    return build_byte_tokenizer()


@pytest.fixture(scope="module")
def qwen():
    return qwen_tokenizer(T.QWEN3)


def converse(renderer, turns):
    """Each sampled turn then a user reply, as the rollout does; the drift check's findings, one per turn."""
    messages = [user_message("hi")]
    held = renderer.render_prompt(messages)
    found = []
    for number, sampled in enumerate(turns):
        held += sampled
        messages = [*messages, {"role": "assistant", "content": renderer.decode_assistant(sampled)},
                    user_message(f"more {number}")]
        held += renderer.render_continuation(held, [messages[-1]])
        found.append(renderer.check_drift(held, messages))
    return held, messages, found


def ids(tokenizer, *parts):
    """Token ids for ``parts``: str parts encoded (special tokens as themselves), ints as ids, bytes as the byte
    tokenizer's ids (its id is the byte's value)."""
    out = []
    for part in parts:
        if isinstance(part, int):
            out.append(part)
        elif isinstance(part, bytes):
            out += list(part)
        else:
            out += tokenizer(part, add_special_tokens=False)["input_ids"]
    return out


# Each case failed before: the control-token check cut one token (or one run) at one place, in the decoded text.
CASES = {
    "apart in one turn": [["<|pad|>", b"\x06;", "<|pad|>"]],
    "inside a character's bytes": [[b"\xe2\xab", "<|im_start|>", b"\x8f{r"]],
    "around two of a character's bytes": [["<|im_start|>", b"\xce", "<|im_start|>", b"\x83f"]],
    "a run then one more": [["a", "<|pad|>", "<|pad|>", b"\xe2", "<|pad|>", b"\x82\xacb", "<|endoftext|>"]],
    "in two turns": [["x<|pad|>y"], ["z", "<|im_start|>", "w<|endoftext|>"]],
}


@pytest.mark.parametrize("case", CASES)
def test_control_tokens_sampled_anywhere_are_the_sample_s_doing_on_the_byte_tokenizer(byte_tokenizer, case):
    renderer = ChatRenderer(byte_tokenizer, strict=True)  # strict: template drift would raise
    _, _, found = converse(renderer, [ids(byte_tokenizer, *parts) for parts in CASES[case]])
    assert found[-1] is not None and found[-1].kind == "control_token"
    assert all(d is None or d.kind == "control_token" for d in found)
    assert renderer.stats["non_prefix_preserving"] == 0


def random_turns(rng, tokenizer, middle, pieces, turns=2):
    """A random model's turns: single bytes (incomplete UTF-8 included), other tokens and control tokens anywhere,
    ended by the end of turn, the end of text, or the token budget."""
    im_end, eot = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))
    out = []
    for _ in range(turns):
        sampled = []
        for _ in range(rng.randint(1, 12)):
            draw = rng.random()
            sampled.append(rng.choice(middle) if draw < 0.12 else rng.choice(pieces[0] if draw < 0.5 else pieces[1]))
        end = rng.random()
        out.append(sampled + ([im_end] if end < 0.3 else [eot] if end < 0.6 else []))
    return out


def control_ids(renderer, tokenizer):
    middle = [i for i in renderer._control_token_ids()
              if tokenizer.convert_ids_to_tokens(i) not in ("<|im_end|>", "<|endoftext|>")]
    assert middle
    return sorted(middle)


def test_random_samples_with_control_tokens_are_never_template_drift_on_the_byte_tokenizer(byte_tokenizer):
    # Before the fix, 90 of these 300 conversations were reported as template drift.
    renderer = ChatRenderer(byte_tokenizer, strict=True)
    middle = control_ids(renderer, byte_tokenizer)
    pieces = (list(range(128, 256)), [byte_tokenizer.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"])
    rng, kinds = random.Random(0), []
    for _ in range(300):
        _, _, found = converse(renderer, random_turns(rng, byte_tokenizer, middle, pieces))
        kinds += [d.kind for d in found if d is not None]
    assert kinds.count("control_token") > 100 and set(kinds) == {"control_token"}


def test_random_samples_with_control_tokens_are_never_template_drift_on_qwen_bpe(qwen):
    # Qwen's vocabulary re-tokenizes the joined text; 54 of these 200 conversations drifted before the fix.
    renderer = ChatRenderer(qwen, strict=True)
    middle = control_ids(renderer, qwen)
    single = sorted(i for t, i in qwen.get_vocab().items() if len(t) == 1 and i < 256)
    rng, kinds = random.Random(0), []
    pieces = (single, [rng.randrange(0, 151643) for _ in range(5000)])
    for _ in range(200):
        _, _, found = converse(renderer, random_turns(rng, qwen, middle, pieces))
        kinds += [d.kind for d in found if d is not None]
    assert kinds.count("control_token") > 50 and set(kinds) == {"control_token"}


@pytest.mark.parametrize("which", ["byte", "qwen"])
def test_a_template_difference_after_a_sampled_control_token_is_reported_where_it_is(byte_tokenizer, qwen, which):
    # The first difference is the sampled <|pad|>; the template's own difference (JSON spacing the parser reads
    # back and the template writes otherwise) comes a turn later and must not hide behind it.
    tokenizer = byte_tokenizer if which == "byte" else qwen
    renderer = ChatRenderer(tokenizer)
    calc = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}
    messages = [user_message("hi")]
    held = renderer.render_prompt(messages, [calc])
    pad = next(i for i in control_ids(renderer, tokenizer))
    call = '<tool_call>\n{"name":"calc", "arguments": {}}\n</tool_call>'
    for sampled, reply in ((ids(tokenizer, "ok", pad, "go<|im_end|>"), user_message("go on")),
                           (ids(tokenizer, call, "<|im_end|>"), {"role": "tool", "tool_call_id": "c", "content": "1"})):
        held += sampled
        messages = [*messages, {"role": "assistant", "content": renderer.decode_assistant(sampled)}, reply]
        held += renderer.render_continuation(held, [reply], [calc])
    with pytest.warns(NonPrefixPreservingTemplateWarning):
        drift = renderer.check_drift(held, messages, [calc])
    assert drift is not None and drift.kind == "rerendered"
    assert '":"calc"' in drift.held and '": "calc"' in drift.rendered
    # The index is the episode's own: the held tokens from there decode to the quoted text.
    assert tokenizer.decode(held[drift.token_index:], skip_special_tokens=False).startswith(drift.held[:8])
    assert held.index(pad) < drift.token_index


@pytest.mark.parametrize("which", ["byte", "qwen"])
def test_hundreds_of_sampled_control_tokens_are_still_the_sample_s_doing(byte_tokenizer, qwen, which):
    # A degenerate policy may sample padding by the hundred: scattered over its turns, or in one long run. Cutting
    # them one first difference at a time stopped at 256 (the rest was reported as template drift, raising under
    # strict) and cost ~30 ms of CPU per control token on a 9k-token episode, every turn.
    tokenizer = byte_tokenizer if which == "byte" else qwen
    renderer = ChatRenderer(tokenizer, strict=True)
    pad = control_ids(renderer, tokenizer)[0]
    rng = random.Random(1)
    turns = []
    for number in range(4):
        sampled = ids(tokenizer, " ".join(rng.choice(["alpha", "beta", "délta", "€uro"]) for _ in range(150)))
        for _ in range(80):
            at = rng.randrange(len(sampled) + 1)
            sampled[at:at] = [pad]
        if number == 2:
            sampled[10:10] = [pad] * 300
        turns.append(sampled + ids(tokenizer, "<|im_end|>"))
    held, _, found = converse(renderer, turns)
    assert sum(turn.count(pad) for turn in turns) == 620 and len(held) > 1500
    assert [d.kind for d in found] == ["control_token"] * 4
    assert renderer.stats["non_prefix_preserving"] == 0


def test_control_tokens_sampled_inside_reasoning_the_template_drops_leave_it_reasoning_dropped(byte_tokenizer):
    # Qwen3 drops an earlier turn's reasoning. Padding sampled inside it split the reasoning text and pushed its
    # </think> out of the compared window: the drift was called a re-render (raising under strict) instead of
    # dropped reasoning, which the reasoning mode handles.
    renderer = ChatRenderer(byte_tokenizer, chat_template=T.QWEN3, strict=True)
    sampled = ids(byte_tokenizer, "<think>\nLet", *["<|pad|>"] * 30, " me think.\n</think>\n\nHello.<|im_end|>")
    _, _, found = converse(renderer, [sampled])
    assert found[0] is not None and found[0].kind == "reasoning_dropped"
    assert renderer.stats["non_prefix_preserving"] == 0 and renderer.stats["reasoning_dropped"] == 1
