"""The tiny model kit: byte tokenizer, chat template with tools, save/load round trip."""

import json

import pytest
import torch

from forge_env.models import (
    BYTE_VOCAB_SIZE,
    TINY_MODEL_ID,
    ModelLoadError,
    build_byte_tokenizer,
    build_tiny_model,
    load_model_and_tokenizer,
    save_tiny_model,
)
from forge_env.types import assistant_message, make_tool_call, system_message, tool_message, user_message

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def test_bytes_are_tokens_and_control_tokens_are_single(tokenizer):
    text = "hé <tool_call>{}</tool_call><|im_end|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[:4] == [ord("h"), 0xC3, 0xA9, ord(" ")]
    for token in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<|pad|>"]:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    assert len(tokenizer) == BYTE_VOCAB_SIZE
    assert tokenizer.decode(ids) == text
    # Tool-call markup survives skip_special_tokens (the parser must see it); control tokens do not.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hé <tool_call>{}</tool_call>"


def test_chat_template_renders_tools_calls_and_responses(tokenizer):
    call = make_tool_call("calc", {"expression": "2+3"}, call_id="c1")
    messages = [
        system_message("Solve it."),
        user_message("2+3?"),
        assistant_message("", [call]),
        tool_message("5", "c1", "calc"),
        assistant_message("5"),
    ]
    text = tokenizer.apply_chat_template(messages, tools=[CALC], add_generation_prompt=False, tokenize=False)
    assert text.startswith("<|im_start|>system\nSolve it.\nTools:\ncalc(expression: string)<|im_end|>\n")
    assert '<|im_start|>assistant\n<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call><|im_end|>\n' in text
    assert "<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n5<|im_end|>\n")
    prompt = tokenizer.apply_chat_template(messages[1:2], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    # dict arguments render like the JSON-string form
    dict_call = {"type": "function", "function": {"name": "calc", "arguments": {"expression": "2+3"}}}
    again = tokenizer.apply_chat_template([assistant_message("", [dict_call])], tokenize=False)
    assert json.dumps({"expression": "2+3"}) in again


def test_tiny_model_save_load_round_trip(tmp_path):
    path = save_tiny_model(tmp_path / "tiny", seed=3)
    model, tokenizer = load_model_and_tokenizer(path)
    fresh = build_tiny_model(3)
    assert 2_000_000 < sum(p.numel() for p in fresh.parameters()) < 10_000_000
    for (name, a), (_, b) in zip(fresh.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    text = "<|im_start|>user\nhi<tool_call><|im_end|>"
    assert tokenizer(text)["input_ids"] == build_byte_tokenizer()(text)["input_ids"]
    assert tokenizer.chat_template == build_byte_tokenizer().chat_template
    assert model.config.eos_token_id == tokenizer.eos_token_id
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, fresh(ids).logits)


def test_seeds_give_different_reproducible_weights():
    a, b, c = build_tiny_model(0), build_tiny_model(0), build_tiny_model(1)
    w = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(a.state_dict()[w], b.state_dict()[w])
    assert not torch.equal(a.state_dict()[w], c.state_dict()[w])


def test_tiny_id_loads_without_files():
    model, tokenizer = load_model_and_tokenizer(TINY_MODEL_ID, seed=0)
    assert model.config.model_type == "qwen3" and tokenizer.eos_token == "<|im_end|>"


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="local checkpoint directory"):
        load_model_and_tokenizer(tmp_path / "nothing-here")


def test_importing_the_kit_does_not_import_transformers():
    import subprocess
    import sys

    code = "import sys, forge_env.models; assert 'transformers' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=".")
