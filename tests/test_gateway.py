"""The agent gateway over real HTTP: the ``openai`` SDK against uvicorn on 127.0.0.1, the tiny model behind it.

Token-exact capture of multi-turn (tool) conversations, logprobs and KV reuse, a harness that edits its history,
hostile requests, many concurrent episodes.
"""

import asyncio
import json

import httpx
import openai
import pytest
import torch

from agents.gateway import HISTORY_EDITED, AgentGateway, GatewayConfig
from agents.gateway.app import GatewayServer, GatewayServeSettings
from forge_env.chat import ChatRenderer
from forge_env.generation.base import Completion, SamplingParams
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::forge_env.chat.NonPrefixPreservingTemplateWarning")

# Stopping on any letter keeps a random model's turns short.
STOP_ON_LETTERS = tuple(range(ord("a"), ord("z") + 1))
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate",
                                           "parameters": {"type": "object",
                                                          "properties": {"expr": {"type": "string"}}}}}]
TOKEN = "harness-token"


@pytest.fixture(scope="module")
def kit():
    tokenizer = build_byte_tokenizer()
    model = build_tiny_model(seed=0)
    generator = HFGenerator(model, tokenizer, HFGeneratorConfig(max_batch_size=16))
    yield model, tokenizer, generator
    generator.close()


def make_gateway(generator, tokenizer, **config):
    sampling = SamplingParams(temperature=1.0, max_tokens=16, stop_token_ids=STOP_ON_LETTERS)
    return AgentGateway(generator, ChatRenderer(tokenizer), GatewayConfig(default_sampling=sampling, **config))


def client(server, episode_id, **kw):
    return openai.AsyncOpenAI(base_url=server.episode_url(episode_id), api_key=TOKEN, max_retries=0, **kw)


def spliced_render(renderer, tokenizer, messages, sampled, first=0, tools=TOOLS):
    """The whole conversation rendered in one go with a placeholder per sampled assistant turn (those from message
    ``first`` on), each replaced by the ids sampled for it: what a correct incremental capture holds."""
    shown, turn = [], 0
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and index >= first:
            message = {"role": "assistant", "content": f"@@{turn}@@"}
            turn += 1
        shown.append(message)
    text = renderer.render_text(shown, tools, add_generation_prompt=True)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = []
    for index in range(turn):
        before, text = text.split(f"@@{index}@@", 1)
        piece = tokenizer.encode(before, add_special_tokens=False)
        if expected and expected[-1] == im_end and piece[:1] == [im_end]:
            piece = piece[1:]  # the sampled turn already ended with the end-of-turn token
        expected += piece + sampled[index]
    return expected  # the conversation ends with the last sampled turn


def forward_logprobs(model, token_ids):
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    logprobs = logits.log_softmax(-1)
    return [0.0] + [float(logprobs[i - 1, token_ids[i]]) for i in range(1, len(token_ids))]


async def test_multi_turn_conversation_is_token_exact_with_logprobs_and_kv_reuse(kit):
    model, tokenizer, generator = kit
    gateway = make_gateway(generator, tokenizer)
    # A harness-written tool exchange opens the conversation; then the model's turns and the user's replies.
    messages = [{"role": "system", "content": "Use calc."}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+2"}'}}]},
                {"role": "tool", "tool_call_id": "call_0", "name": "calc", "content": "4"}]
    async with GatewayServer(gateway, GatewayServeSettings(token=TOKEN)) as server:
        api = client(server, "conv")
        cached, sampled_logprobs = [], []
        for turn in range(3):
            if turn == 1:  # one call streamed: the same capture, delivered as SSE chunks
                stream = await api.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                           stream=True, stream_options={"include_usage": True})
                # Reassembled as an SDK user does: content, reasoning and tool calls (the random model can
                # sample the template's tool-call or think tags; dropping them would be a history edit).
                content, reasoning, calls, usage, finish = "", "", {}, None, None
                async for chunk in stream:
                    if chunk.choices:
                        delta = chunk.choices[0].delta
                        content += delta.content or ""
                        reasoning += getattr(delta, "reasoning_content", None) or ""
                        for call in delta.tool_calls or []:
                            entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                                  "function": {"name": "", "arguments": ""}})
                            entry["id"] += call.id or ""
                            entry["function"]["name"] += (call.function and call.function.name) or ""
                            entry["function"]["arguments"] += (call.function and call.function.arguments) or ""
                        finish = chunk.choices[0].finish_reason or finish
                    usage = chunk.usage or usage
                assert finish in ("stop", "length", "tool_calls")
                reply = {"role": "assistant", "content": content if content or not calls else None}
                if reasoning:
                    reply["reasoning_content"] = reasoning
                if calls:
                    reply["tool_calls"] = [calls[i] for i in sorted(calls)]
                cached.append(usage.prompt_tokens_details.cached_tokens)
            else:
                response = await api.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                             logprobs=True)
                choice = response.choices[0]
                reply = choice.message.model_dump(exclude_none=True)  # sent back the way SDK users do
                sampled_logprobs.append([entry.logprob for entry in choice.logprobs.content])
                cached.append(response.usage.prompt_tokens_details.cached_tokens)
            messages = [*messages, reply, {"role": "user", "content": f"again {turn}"}]
        await api.close()
    trajectory = await gateway.finish("conv", reward=1.0)
    trajectory.check()
    assert trajectory.ok and trajectory.reward == 1.0 and len(trajectory.turns) == 3
    assert trajectory.segment_starts == [0] and not trajectory.drifted
    # KV reuse from the second call on, in the usage the harness sees and in the trajectory.
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert [t.num_cached_tokens for t in trajectory.turns] == cached
    # The tokens are a full re-render of the conversation with the sampled ids spliced in verbatim.
    renderer = gateway.renderer
    sampled = [trajectory.sampled_ids(i) for i in range(3)]
    assert trajectory.token_ids == spliced_render(renderer, tokenizer, messages[:-1], sampled, first=4)
    # The logprobs the harness got are the trajectory's, and those of a forward pass (temperature 1, no filters).
    assert sampled_logprobs[0] == pytest.approx([trajectory.logprobs[i] for i in range(
        trajectory.turns[0].gen_start, trajectory.turns[0].gen_end)])
    recomputed = forward_logprobs(model, trajectory.token_ids)
    for i, mask in enumerate(trajectory.loss_mask):
        if mask:
            assert trajectory.logprobs[i] == pytest.approx(recomputed[i], abs=2e-3)
    sample = trajectory.to_sample(advantage=0.5)
    assert sample.policy_versions == [0, 0, 0] and sum(sample.loss_mask) == sum(len(s) for s in sampled)


class ScriptedPolicy:
    """Stands in for a model that calls tools (the random tiny model does not): returns the given turns in order,
    tokenized by the tiny model's tokenizer, with the Generator contract."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.sessions, self.prompts = tokenizer, list(turns), [], []

    async def generate(self, prompt_ids, sampling, session_id=None):
        self.sessions.append(session_id)
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        ids = self.tokenizer(self.turns.pop(0), add_special_tokens=False)["input_ids"]
        return Completion(prompt_ids=list(prompt_ids), token_ids=ids, logprobs=[-0.25] * len(ids), text="",
                          finish_reason="stop", policy_version=7)

    async def release_session(self, session_id):
        pass


async def test_tool_calls_are_parsed_and_the_conversation_equals_a_full_re_render():
    tokenizer = build_byte_tokenizer()
    policy = ScriptedPolicy(tokenizer, ['<tool_call>{"name": "calc", "arguments": {"expr": "6*7"}}</tool_call><|im_end|>',
                                        "It is 42.<|im_end|>"])
    gateway = AgentGateway(policy, ChatRenderer(tokenizer))
    async with GatewayServer(gateway) as server:
        api = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0,
                                 default_headers={"X-Episode-ID": "tools"})
        messages = [{"role": "user", "content": "6*7?"}]
        first = await api.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("calc", {"expr": "6*7"})
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "name": "calc", "content": "42"}]
        second = await api.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert second.choices[0].message.content == "It is 42."
        await api.close()
    trajectory = await gateway.finish("tools", reward=1.0)
    final = [*messages, {"role": "assistant", "content": "It is 42."}]
    rendered = gateway.renderer.render(final, TOOLS)  # prefix-preserving: exact, up to the turn's final newline
    assert trajectory.token_ids == rendered[:-1] and tokenizer.decode(rendered[-1:]) == "\n"
    assert trajectory.drift == [] and policy.sessions == ["gateway-tools"] * 2
    assert trajectory.policy_versions == [7, 7]


async def test_a_history_edit_starts_a_segment_with_a_recorded_drift(kit):
    _, tokenizer, generator = kit
    gateway = make_gateway(generator, tokenizer)
    async with GatewayServer(gateway) as server:
        api = client(server, "edit")
        base = [{"role": "user", "content": "Run a command."}]
        first = await api.chat.completions.create(model="m", messages=base)
        kept = first.choices[0].message.model_dump(exclude_none=True)
        messages = [*base, kept, {"role": "user", "content": "Output?"}]
        second = await api.chat.completions.create(model="m", messages=messages)
        # mini-swe-agent's way: the reply without a command is dropped, an error message added instead
        edited = [*messages, {"role": "user", "content": "Format error: no command found."}]
        assert second.choices[0].message.content is not None
        third = await api.chat.completions.create(model="m", messages=edited)
        assert third.choices[0].finish_reason in ("stop", "length")
        await api.close()
    trajectory = await gateway.finish("edit")
    trajectory.check()
    assert len(trajectory.segment_starts) == 2 and gateway.stats["history_edits"] == 1
    edit = [record for record in trajectory.drift if record["kind"] == HISTORY_EDITED]
    assert len(edit) == 1 and edit[0]["message_index"] == 3 and "differs" in edit[0]["why"]
    assert edit[0]["token_index"] == trajectory.segment_starts[1] and edit[0]["segment"] == 1
    # The new segment holds turn 0's sampled ids verbatim (as context: they are trained on once).
    segment = trajectory.token_ids[trajectory.segment_starts[1]:]
    first_ids = trajectory.sampled_ids(0)
    assert any(segment[i:i + len(first_ids)] == first_ids for i in range(len(segment)))
    samples = trajectory.to_samples()
    assert len(samples) == 2 and sum(sum(s.loss_mask) for s in samples) == trajectory.num_sampled_tokens


async def test_hostile_requests_get_openai_errors_and_the_server_keeps_serving(kit):
    _, tokenizer, generator = kit
    gateway = make_gateway(generator, tokenizer, max_episodes=2, max_calls_per_episode=3)
    settings = GatewayServeSettings(token=TOKEN, max_body_bytes=64 * 1024)
    async with GatewayServer(gateway, settings) as server:
        url = server.episode_url("hostile") + "/chat/completions"
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        ok_body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with httpx.AsyncClient(timeout=30) as http:
            cases = {
                "huge": (b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a" * 200_000 + b'"}]}', 413),
                "deep": (b'{"model": "m", "messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", 400),
                "utf8": (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
                "unknown": (json.dumps({**ok_body, "frobnicate": 1}).encode(), 400),
                "n": (json.dumps({**ok_body, "n": 2}).encode(), 400),
                "role": (json.dumps({**ok_body, "messages": [{"role": "wizard", "content": "x"}]}).encode(), 400),
                "not json": (b"{nope", 400),
            }
            for name, (body, status) in cases.items():
                answer = await http.post(url, content=body, headers=auth)
                assert answer.status_code == status, (name, answer.text)
                error = answer.json()["error"]
                assert error["message"] and error["type"], name
            assert (await http.post(url, content=json.dumps({**ok_body, "frobnicate": 1}), headers=auth)
                    ).json()["error"]["param"] == "frobnicate"
            assert (await http.post(url, json=ok_body)).status_code == 401  # no bearer token
            assert (await http.post(f"{server.base_url}/v1/chat/completions", json=ok_body, headers=auth)
                    ).status_code == 400  # no episode
            assert (await http.post(f"{server.base_url}/admin/episodes/hostile/finish", json={"reward": 1},
                                    headers=auth)).status_code == 404  # a harness cannot grade itself
            # a client that disconnects mid-stream
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            payload = json.dumps({**ok_body, "stream": True}).encode()
            writer.write(f"POST /e/hostile/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
            await reader.read(10)
            writer.close()
            # bounded open episodes: "hostile" is one, a second fits, a third does not
            second = await http.post(server.episode_url("two") + "/chat/completions", json=ok_body, headers=auth)
            third = await http.post(server.episode_url("three") + "/chat/completions", json=ok_body, headers=auth)
            assert second.status_code == 200 and third.status_code == 429
            assert third.json()["error"]["code"] == "too_many_episodes"
            # still serving
            answer = await http.post(url, json=ok_body, headers=auth)
            assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["role"] == "assistant"
            assert (await http.post(url, json=ok_body, headers=auth)).status_code == 200  # its third call
            over = await http.post(url, json=ok_body, headers=auth)
            assert over.status_code == 429 and over.json()["error"]["code"] == "too_many_calls"
            models = await http.get(server.episode_url("hostile") + "/models", headers=auth)
            assert models.json()["data"][0]["id"] == gateway.config.model_name
    trajectory = await gateway.finish("hostile")
    trajectory.check()


async def test_a_failed_call_leaves_no_trace_and_the_episode_goes_on(kit):
    _, tokenizer, generator = kit
    gateway = make_gateway(generator, tokenizer)
    async with GatewayServer(gateway) as server:
        api = client(server, "retry")
        messages = [{"role": "user", "content": "hi"}]
        first = await api.chat.completions.create(model="m", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        with pytest.raises(openai.BadRequestError) as refused:  # past the model's context: the generator refuses
            await api.chat.completions.create(model="m", messages=[*messages, {"role": "user", "content": "x" * 9000}])
        assert refused.value.code == "context_length_exceeded"
        messages += [{"role": "user", "content": "go on"}]
        second = await api.chat.completions.create(model="m", messages=messages)
        assert second.usage.prompt_tokens_details.cached_tokens > 0
        await api.close()
    trajectory = await gateway.finish("retry")
    trajectory.check()
    assert len(trajectory.turns) == 2 and trajectory.segment_starts == [0] and gateway.stats["errors"] == 1
    sampled = [trajectory.sampled_ids(i) for i in range(2)]
    expected = spliced_render(gateway.renderer, tokenizer, [*messages, {"role": "assistant", "content": ""}], sampled,
                              tools=None)
    assert trajectory.token_ids == expected


async def test_sixteen_concurrent_episodes(kit):
    _, tokenizer, generator = kit
    gateway = make_gateway(generator, tokenizer)

    async def episode(server, number):
        api = client(server, f"ep{number}")
        messages = [{"role": "user", "content": f"task {number}"}]
        for _ in range(2):
            response = await api.chat.completions.create(model="m", messages=messages, max_tokens=8)
            messages += [response.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
        await api.close()
        return await gateway.finish(f"ep{number}", reward=float(number))

    async with GatewayServer(gateway, GatewayServeSettings(token=TOKEN)) as server:
        trajectories = await asyncio.gather(*(episode(server, n) for n in range(16)))
    for number, trajectory in enumerate(trajectories):
        trajectory.check()
        assert trajectory.episode_id == f"ep{number}" and trajectory.reward == number
        assert len(trajectory.turns) == 2 and trajectory.segment_starts == [0]
        assert trajectory.turns[1].num_cached_tokens > 0
    assert gateway.open_episodes == [] and gateway.stats["finished"] == 16


async def test_idle_episodes_expire_and_are_counted(kit):
    _, tokenizer, generator = kit
    gateway = make_gateway(generator, tokenizer, episode_ttl_s=0.0)
    gateway.open_episode("idle")
    assert gateway.expire() == ["idle"] and gateway.stats["expired"] == 1
    with pytest.raises(Exception, match="no open episode"):
        await gateway.finish("idle")


async def test_reasoning_is_returned_apart_and_a_reply_sent_back_without_it_still_extends():
    from tests import chat_templates

    tokenizer = build_byte_tokenizer()
    policy = ScriptedPolicy(tokenizer, ["<think>\nAdd.\n</think>\n\nIt is 3.<|im_end|>", "Yes.<|im_end|>",
                                        "Sure.<|im_end|>"])
    gateway = AgentGateway(policy, ChatRenderer(tokenizer, chat_template=chat_templates.QWEN3))
    messages = [{"role": "user", "content": "1+2?"}]
    first = await gateway.chat("think", messages)
    assert first.message == {"role": "assistant", "content": "It is 3.", "reasoning_content": "Add."}
    kept = {"role": "assistant", "content": "It is 3."}  # many harnesses drop reasoning_content
    await gateway.chat("think", [*messages, kept, {"role": "user", "content": "Sure?"}])
    # an edit that keeps the first reply: the new segment holds its sampled ids, reasoning included
    await gateway.chat("think", [*messages, kept, {"role": "user", "content": "Really?"}])
    trajectory = await gateway.finish("think")
    trajectory.check()
    assert len(trajectory.segment_starts) == 2 and gateway.stats["history_edits"] == 1
    segment = trajectory.token_ids[trajectory.segment_starts[1]:]
    first_ids = trajectory.sampled_ids(0)
    assert any(segment[i:i + len(first_ids)] == first_ids for i in range(len(segment)))


async def test_a_stream_comes_a_character_at_a_time_and_reassembles_to_the_non_streamed_message():
    from openai.lib.streaming.chat import ChatCompletionStreamState

    from tests import chat_templates

    tokenizer = build_byte_tokenizer()  # one token per byte: "é" and "✓" end mid-character after their first byte
    turns = ["<think>\nWhy é?\n</think>\n\nLet me check ✓ é.<tool_call>"
             '{"name": "calc", "arguments": {"expr": "6*7"}}</tool_call><|im_end|>', "It is 42 ✓.<|im_end|>"]
    replies = {}
    for mode in ("plain", "stream"):
        gateway = AgentGateway(ScriptedPolicy(tokenizer, turns), ChatRenderer(tokenizer,
                                                                               chat_template=chat_templates.QWEN3))
        async with GatewayServer(gateway) as server:
            api = client(server, mode)
            messages = [{"role": "user", "content": "6*7?"}]
            for _ in turns:
                if mode == "plain":
                    reply = await api.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                              logprobs=True)
                else:
                    state = ChatCompletionStreamState(input_tools=TOOLS)
                    deltas = []
                    async for chunk in await api.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                                        logprobs=True, stream=True):
                        state.handle_chunk(chunk)
                        deltas.append(chunk.choices[0].delta if chunk.choices else None)
                    reply = state.get_final_completion()
                    pieces = [d.content for d in deltas if d is not None and d.content]
                    text = reply.choices[0].message.content
                    # one chunk per character (a byte token that ends mid-character waits for the next one)
                    assert len(pieces) == len(text) and "\ufffd" not in "".join(pieces)
                    assert deltas[-1] is not None and deltas[-1].content is None
                choice = reply.choices[0]
                replies.setdefault(mode, []).append((choice.message.content, choice.message.model_dump().get(
                    "reasoning_content"), [(bool(c.id), c.function.name, c.function.arguments)
                                           for c in choice.message.tool_calls or []], choice.finish_reason,
                    [(e.token, e.logprob) for e in choice.logprobs.content]))
                messages += [choice.message.model_dump(exclude_none=True, exclude={"parsed"}),
                             {"role": "tool", "tool_call_id": "x", "name": "calc", "content": "42"}]
            await api.close()
        assert gateway.stats["history_edits"] == 0  # the reassembled reply sent back extends the history
    assert replies["stream"] == replies["plain"]
    (content, reasoning, calls, finish, logprobs), second = replies["plain"]
    assert content == "Let me check ✓ é." and reasoning == "Why é?" and finish == "tool_calls"
    assert calls[0][1] == "calc" and len(logprobs) == len(tokenizer(turns[0], add_special_tokens=False)["input_ids"])
    assert second[0] == "It is 42 ✓." and second[3] == "stop"


OTHER = {"type": "function", "function": {"name": "lookup", "description": "find a word",
                                          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "1"}}</tool_call><|im_end|>'


async def test_tool_choice_none_and_a_named_function_shape_the_prompt_and_the_reply():
    tokenizer = build_byte_tokenizer()
    policy = ScriptedPolicy(tokenizer, [CALL, CALL, CALL])
    gateway = AgentGateway(policy, ChatRenderer(tokenizer))
    async with GatewayServer(gateway) as server:
        api = client(server, "choice")
        ask = [{"role": "user", "content": "go"}]
        auto = await api.chat.completions.create(model="m", messages=ask, tools=[*TOOLS, OTHER])
        assert auto.choices[0].message.tool_calls and "lookup(" in policy.prompts[-1]
        # "none": the template gets no tools and the reply no tool calls (the sampled text is its content)
        none = await api.chat.completions.create(model="m", messages=ask, tools=[*TOOLS, OTHER], tool_choice="none")
        assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop"
        assert none.choices[0].message.content == CALL.removesuffix("<|im_end|>")
        assert "Tools:" not in policy.prompts[-1] and "calc(" not in policy.prompts[-1]
        # a named function: only that tool is rendered
        named = await api.chat.completions.create(model="m", messages=ask, tools=[*TOOLS, OTHER],
                                                  tool_choice={"type": "function", "function": {"name": "calc"}})
        assert named.choices[0].message.tool_calls[0].function.name == "calc"
        assert "calc(" in policy.prompts[-1] and "lookup(" not in policy.prompts[-1]
        for bad in ({"type": "function", "function": {"name": "nope"}}, {"type": "function", "function": {}}):
            with pytest.raises(openai.BadRequestError) as refused:
                await api.chat.completions.create(model="m", messages=ask, tools=TOOLS, tool_choice=bad)
            assert refused.value.body["param"] == "tool_choice"
        with pytest.raises(openai.BadRequestError):
            await api.chat.completions.create(model="m", messages=ask, tool_choice="required")  # no tools
        await api.close()
    assert len(policy.prompts) == 3  # the refused calls never reached the generator


async def test_tool_choice_required_resamples_a_reply_without_a_call_then_answers_422():
    tokenizer = build_byte_tokenizer()
    policy = ScriptedPolicy(tokenizer, ["No.<|im_end|>", CALL, "No.<|im_end|>", "Still no.<|im_end|>"])
    gateway = AgentGateway(policy, ChatRenderer(tokenizer), GatewayConfig(tool_choice_retries=1))
    async with GatewayServer(gateway) as server:
        api = client(server, "required")
        ask = [{"role": "user", "content": "go"}]
        first = await api.chat.completions.create(model="m", messages=ask, tools=TOOLS, tool_choice="required")
        assert first.choices[0].message.tool_calls[0].function.name == "calc"
        assert first.choices[0].finish_reason == "tool_calls"
        messages = [*ask, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": "x", "name": "calc", "content": "1"}]
        with pytest.raises(openai.UnprocessableEntityError) as unmet:
            await api.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="required")
        assert unmet.value.body["code"] == "tool_choice_unmet" and unmet.value.body["param"] == "tool_choice"
        await api.close()
    trajectory = await gateway.finish("required")
    trajectory.check()
    # the rejected first sample left no trace; the last unmet sample is the policy's turn and is recorded
    assert len(trajectory.turns) == 2 and trajectory.segment_starts == [0]
    assert tokenizer.decode(trajectory.sampled_ids(1)) == "Still no.<|im_end|>"
    assert gateway.stats["tool_choice_resamples"] == 2 and trajectory.metrics["tool_choice_resamples"] == 2
