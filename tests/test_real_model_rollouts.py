"""Token-exact trajectories of the real model (SmolLM2-135M-Instruct, issue 43): rollouts, eval, the gateway.

SmolLM2's chat template is plain ChatML without tool support, so a trajectory records its messages as the template
saw them (the tool listing in the system message, calls in the assistant's text, tool results as ``tool``
messages, which it renders). The rule checked here (docs/generation.md, "Trajectory messages"): for every turn,
the tokenizer's own ``apply_chat_template(trajectory.messages[:k], add_generation_prompt=True)`` (``k`` the turn's
assistant message) is the turn's prompt, token for token, and with the turn's message it is the prompt + the
sampled ids + the template's end-of-turn markup the sampler did not produce (``"\\n"`` after a sampled
``<|im_end|>``; ``"<|im_end|>\\n"`` for a turn cut by ``max_tokens``). No ``tools=`` is needed (the template
ignores it), and no drift is recorded.

The model rarely calls a tool on its own, so the ToolUse-v0 and Arithmetic-v0 rollouts script the first turn (a
tool call, tokenized as the tokenizer does); the env answers it and the model samples the next turn itself.
``forge-env eval`` plays the model's own episodes; the gateway serves it to the ``openai`` SDK with a tool in the
request. Kept short: 12 new tokens a turn, two turns, one loaded model per module.
"""

from __future__ import annotations

import json
from dataclasses import replace

import openai
import pytest

import forge_env
from agents.gateway import AgentGateway, GatewayConfig
from agents.gateway.app import GatewayServer, GatewayServeSettings
from agents.rollout import EpisodeBudget, run_episode
from agents.trajectory import read_jsonl
from forge_env.chat import ChatRenderer
from forge_env.generation import HFGenerator, SamplingParams
from forge_env.generation.base import Completion
from forge_env.models import load_model_and_tokenizer
from tests.real_model import MODEL_ID, cache_env, smollm2_checkpoint

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def kit():
    model, tokenizer = load_model_and_tokenizer(smollm2_checkpoint())
    generator = HFGenerator(model, tokenizer)
    yield tokenizer, generator
    generator.close()


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_ids(tokenizer, messages, generation_prompt, **kw):
    """The tokenizer's own ``apply_chat_template``, tokenized by it."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def assert_reproduced(tokenizer, trajectory):
    """The rule in the module docstring, turn by turn; returns how many sampled turns the tokenizer would have
    split otherwise (their text is the same; the trajectory keeps the ids the model sampled)."""
    assert trajectory.drift == [] and trajectory.segment_starts == [0]
    messages, ids = trajectory.messages, trajectory.token_ids
    assert "<tools>" in messages[0]["content"] and messages[0]["role"] == "system"
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the sampled turns are the last assistant messages (a harness may send earlier ones as context)
    sampled_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"][-len(trajectory.turns):]
    retokenized = 0
    for index, (turn, k) in enumerate(zip(trajectory.turns, sampled_at, strict=True)):
        sampled = ids[turn.gen_start:turn.gen_end]
        ended = sampled[-1:] == [im_end]
        closing = encode(tokenizer, "\n" if ended else "<|im_end|>\n")
        # the text: always the template's, character for character
        text = tokenizer.apply_chat_template(messages[:k + 1], tokenize=False)
        assert tokenizer.decode(ids[:turn.gen_end] + closing) == text, f"turn at {k}"
        # the ids: the template's rendering tokenized by the tokenizer, each sampled turn as the ids sampled
        assert ids[:turn.gen_end] + closing == spliced(tokenizer, messages[:k + 1], trajectory, sampled_at[:index + 1])
        canonical = encode(tokenizer, messages[k]["content"]) + ([im_end] if ended else []) == sampled
        retokenized += not canonical
        if not retokenized:  # every turn so far sampled as the tokenizer splits it: the plain rendering is exact
            assert ids[:turn.gen_start] == chat_ids(tokenizer, messages[:k], True), f"prompt of the turn at {k}"
            assert chat_ids(tokenizer, messages[:k + 1], False) == ids[:turn.gen_end] + closing, f"turn at {k}"
    if not retokenized:  # tools= changes nothing: the listing is in the messages
        last = trajectory.turns[-1].gen_start
        assert chat_ids(tokenizer, messages[:sampled_at[-1]], True, tools=trajectory.tools) == ids[:last]
    return retokenized


def spliced(tokenizer, messages, trajectory, sampled_at):
    """``apply_chat_template(messages)`` tokenized, with the content of each sampled turn as its sampled ids."""
    shown = [{"role": "assistant", "content": f"@@{sampled_at.index(i)}@@"} if i in sampled_at else m
             for i, m in enumerate(messages)]
    text = tokenizer.apply_chat_template(shown, tokenize=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for n, turn in enumerate(trajectory.turns[:len(sampled_at)]):
        before, text = text.split(f"@@{n}@@", 1)
        piece = encode(tokenizer, before)
        if out and out[-1] == im_end and piece[:1] == [im_end]:
            piece = piece[1:]  # the sampled turn ended with the end-of-turn token itself
        out += piece + trajectory.token_ids[turn.gen_start:turn.gen_end]
    piece = encode(tokenizer, text)
    return out + (piece[1:] if out[-1] == im_end and piece[:1] == [im_end] else piece)


class ScriptedFirstTurn:
    """The generator, except that each session's first turn is ``text`` (a tool call, tokenized canonically)."""

    def __init__(self, generator, tokenizer, text):
        self.generator, self.tokenizer, self.text, self.sessions = generator, tokenizer, text, set()

    def __getattr__(self, name):
        return getattr(self.generator, name)

    async def generate(self, prompt_ids, params, session_id=None):
        if session_id in self.sessions:
            return await self.generator.generate(prompt_ids, params, session_id=session_id)
        self.sessions.add(session_id)
        ids = encode(self.tokenizer, self.text + "<|im_end|>")
        return Completion(prompt_ids=list(prompt_ids), token_ids=ids, logprobs=[0.0] * len(ids), text=self.text,
                          finish_reason="stop", policy_version=0)

    async def release_session(self, session_id):
        await self.generator.release_session(session_id)


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.mark.parametrize("env_id, seed, first_turn", [
    ("forge_env/Arithmetic-v0", 1, call("calculator", expression="3*46")),   # "What is 3*46?"
    ("forge_env/ToolUse-v0", 1, call("search", query="Lona Works")),
    ("forge_env/SWE-v0", 0, call("bash", command="git status --short")),   # the process sandbox
])
async def test_a_rollout_with_a_tool_call_is_the_tokenizers_own_rendering(kit, env_id, seed, first_turn):
    tokenizer, generator = kit
    renderer = ChatRenderer(tokenizer)
    policy = ScriptedFirstTurn(generator, tokenizer, first_turn)
    env = forge_env.make(env_id, **({"spare_sessions": 0} if env_id.endswith("SWE-v0") else {}))
    try:
        trajectory = await run_episode(env, policy, renderer, seed=seed,
                                       sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, seed=seed),
                                       budget=EpisodeBudget(max_turns=2), env_id=env_id)
        env_system = env.state.messages[0]["content"]  # the env's own opening system message
    finally:
        await env.aclose()
    assert trajectory.ok, trajectory.error
    assert len(trajectory.turns) == 2 and trajectory.messages[2] == {"role": "assistant", "content": first_turn}
    assert trajectory.messages[3]["role"] == "tool" and trajectory.turns[0].reward == 0.0  # the env ran the call
    # the model's own second turn, on the tool's result
    assert trajectory.turns[1].gen_end > trajectory.turns[1].gen_start and trajectory.messages[4]["role"] == "assistant"
    assert_reproduced(tokenizer, trajectory)
    assert trajectory.messages[0]["content"].startswith(env_system + "\n\n# Tools")  # the env's text, then the listing
    assert renderer.template_messages(trajectory.messages, trajectory.tools)[0] == trajectory.messages  # idempotent
    assert renderer.stats["non_prefix_preserving"] == 0
    print(f"\n{env_id}: generation {trajectory.generation_s:.1f} s, env {trajectory.env_s:.1f} s, "
          f"{len(trajectory.token_ids)} tokens")


def test_forge_env_eval_pass_at_k_on_the_real_model(kit, tmp_path, capsys):
    from agents.cli import main

    tokenizer, _ = kit
    out = tmp_path / "eval"
    with cache_env():  # --local takes the model id
        code = main(["eval", "forge_env/Arithmetic-v0", "--model", "smollm2", "--local", MODEL_ID, "--device", "cpu",
                     "--n-tasks", "2", "--samples", "2", "--temperature", "1.0", "--max-tokens", str(MAX_TOKENS),
                     "--max-turns", "2", "--out", str(out), "--fail-on-errors"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["level"] == "token" and summary["played"] == 4 and summary["errors"] == 0
    assert summary["tasks"] == 2 and 0.0 <= summary["pass@1"] <= summary["pass@2"] <= 1.0
    episodes = read_jsonl(out / "episodes.jsonl")
    assert len(episodes) == 4
    for trajectory in episodes:  # the model's own episodes, read back from disk
        assert_reproduced(tokenizer, trajectory)
    assert "pass@2" in capsys.readouterr().out


async def test_the_gateway_serves_the_real_model_to_the_openai_sdk_token_exact(kit):
    tokenizer, generator = kit
    tools = forge_env.make("forge_env/Arithmetic-v0").reset(seed=0)[1]["tools"]
    sampling = replace(GatewayConfig().default_sampling, max_tokens=MAX_TOKENS)
    gateway = AgentGateway(generator, ChatRenderer(tokenizer), GatewayConfig(default_sampling=sampling))
    # an SDK user's history: a structured tool call (as the API returns them) and its result, then the model's turn
    messages = [{"role": "system", "content": "Use the calculator tool, then answer with the number."},
                {"role": "user", "content": "What is 17*3?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
                    "name": "calculator", "arguments": '{"expression": "17*3"}'}}]},
                {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "51"}]
    async with GatewayServer(gateway, GatewayServeSettings(token="t")) as server:
        api = openai.AsyncOpenAI(base_url=server.episode_url("real"), api_key="t", max_retries=0)
        response = await api.chat.completions.create(model="smollm2", messages=messages, tools=tools, seed=3,
                                                     logprobs=True)
        await api.close()
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls") and len(choice.logprobs.content) > 0
    trajectory = await gateway.finish("real", reward=1.0)
    assert len(trajectory.turns) == 1 and trajectory.tools == tools
    # the structured call is in the assistant's content, in the markup the model writes calls in
    assert trajectory.messages[2] == {"role": "assistant", "content": call("calculator", expression="17*3")}
    assert trajectory.messages[3]["role"] == "tool" and trajectory.messages[4]["role"] == "assistant"
    assert_reproduced(tokenizer, trajectory)
    assert [e.logprob for e in choice.logprobs.content] == pytest.approx(trajectory.logprobs[
        trajectory.turns[0].gen_start:trajectory.turns[0].gen_end])
