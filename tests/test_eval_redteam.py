"""The endpoint generators against a hostile OpenAI-compatible server on loopback (tests/hostile_endpoint.py).

Whatever the server answers (malformed JSON, tokens outside the vocabulary, logprobs that do not line up or
are not log-probabilities, huge or dripping bodies, redirects, 429 storms asking for an endless Retry-After),
the request ends in a bounded, clearly labelled ``EndpointError``: the episode is an endpoint error, never a
reward of 0, never a hang, and no trajectory holds tokens or logprobs the server made up.
"""

import asyncio
import json

import pytest

from agents.cli import main
from agents.rollout import run_episode
from agents.trajectory import ERROR_ENDPOINT
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams
from forge_env.generation.endpoints import ChatEndpoint, CompletionsGenerator, EndpointConfig, EndpointError
from forge_env.models import TINY_MODEL_ID, build_byte_tokenizer
from tests.hostile_endpoint import HostileEndpoint

VOCAB = len(build_byte_tokenizer())
HANG_GUARD_S = 60  # a request that outlives this hung: the bound under test is a few seconds


def completion(token_ids, logprobs, **extra):
    return {"choices": [{"text": "", "token_ids": token_ids, "logprobs": {"token_logprobs": logprobs},
                         "finish_reason": "stop", **extra}]}


def chat_reply(message, **extra):
    return {"choices": [{"message": message, "finish_reason": "stop"}], **extra}


def call(function, **extra):
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": function}],
            **extra}


STATUS_ATTACKS = {
    "html error page": dict(body=b"<html>502 oops</html>", headers={"Content-Type": "text/html"}),
    "json, but a list": dict(body=[1, 2]),
    "json nested too deeply": dict(body=b"[" * 100_000 + b"]" * 100_000),
    "redirect": dict(status=307, headers={"Location": "/v1/elsewhere", "Content-Length": "0"}, body=b""),
    "429 storm, Retry-After 999999": dict(status=429, headers={"Retry-After": "999999",
                                                               "Content-Type": "application/json"},
                                          body={"error": {"message": "slow down"}}),
}

COMPLETION_ATTACKS = {
    **STATUS_ATTACKS,
    "choice not an object": dict(body={"choices": [1]}),
    "token id a string": dict(body=completion(["a"], [-0.1])),
    "token id a bool": dict(body=completion([True], [-0.1])),
    "token id a float": dict(body=completion([1.7], [-0.1])),
    "token id out of vocabulary": dict(body=completion([VOCAB], [-0.1])),
    "token id negative": dict(body=completion([-1], [-0.1])),
    "fewer logprobs than tokens": dict(body=completion([1, 2], [-0.1])),
    "NaN logprob": dict(body=completion([1], [float("nan")])),
    "-inf logprob": dict(body=completion([1], [float("-inf")])),
    "positive logprob": dict(body=completion([1], [5.0])),
    "null logprob": dict(body=completion([1], [None])),
    "logprobs a list": dict(body={"choices": [{"token_ids": [1], "logprobs": [-0.1]}]}),
    "more tokens than asked": dict(body=completion([1] * 100, [-0.1] * 100)),
    "usage a list": dict(body={**completion([1], [-0.1]), "usage": [1]}),
    "cached tokens a word": dict(body={**completion([1], [-0.1]),
                                       "usage": {"prompt_tokens_details": {"cached_tokens": "many"}}}),
    "dripping body": dict(body=completion([1], [-0.1]), drip=True),
    "huge body": dict(huge_bytes=8 << 20),
}

CHAT_ATTACKS = {
    **STATUS_ATTACKS,
    "choices a string": dict(body={"choices": "x"}),
    "no message": dict(body=chat_reply(None)),
    "content an object": dict(body=chat_reply({"role": "assistant", "content": {"x": 1}})),
    "content parts without text": dict(body=chat_reply({"role": "assistant", "content": [{"text": 3}]})),
    "tool arguments an object": dict(body=chat_reply(call({"name": "calculator", "arguments": {"x": 1}}))),
    "tool name missing": dict(body=chat_reply(call({"name": None, "arguments": "{}"}))),
    "tool calls a string": dict(body=chat_reply({"role": "assistant", "content": "", "tool_calls": "x"})),
    "usage a word": dict(body={**chat_reply({"role": "assistant", "content": "hi"}), "usage": {"prompt_tokens": "x"}}),
    "dripping body": dict(body=chat_reply({"role": "assistant", "content": "hi"}), drip=True),
    "huge body": dict(huge_bytes=8 << 20),
}


@pytest.fixture(scope="module")
def endpoint():
    running = HostileEndpoint()
    yield running
    running.close()


def config(endpoint) -> EndpointConfig:
    return EndpointConfig(base_url=endpoint.url, model="hostile", max_retries=2, backoff_s=0.01, timeout_s=2.0,
                          max_response_bytes=1 << 20)


@pytest.mark.parametrize("attack", COMPLETION_ATTACKS)
async def test_completions_attack_is_an_endpoint_error(endpoint, attack):
    endpoint.behave(**COMPLETION_ATTACKS[attack])
    generator = CompletionsGenerator(config(endpoint), vocab_size=VOCAB)
    try:
        with pytest.raises(EndpointError) as failed:
            await asyncio.wait_for(generator.generate([1, 2, 3], SamplingParams(max_tokens=8)), HANG_GUARD_S)
    finally:
        await generator.aclose()
    assert failed.value.error_kind == ERROR_ENDPOINT
    assert endpoint.requests <= 3  # bounded: the first attempt and at most max_retries more


@pytest.mark.parametrize("attack", CHAT_ATTACKS)
async def test_chat_attack_is_an_endpoint_error(endpoint, attack):
    endpoint.behave(**CHAT_ATTACKS[attack])
    client = ChatEndpoint(config(endpoint))
    try:
        with pytest.raises(EndpointError) as failed:
            await asyncio.wait_for(client.chat([{"role": "user", "content": "hi"}]), HANG_GUARD_S)
    finally:
        await client.aclose()
    assert failed.value.error_kind == ERROR_ENDPOINT


async def test_a_turn_with_made_up_logprobs_never_reaches_the_trajectory(endpoint):
    import forge_env

    endpoint.behave(body=completion([ord("4")], [float("nan")]))
    generator = CompletionsGenerator(config(endpoint), vocab_size=VOCAB)
    env = forge_env.make("forge_env/Arithmetic-v0")
    try:
        trajectory = await asyncio.wait_for(run_episode(env, generator, ChatRenderer(build_byte_tokenizer()),
                                                        sampling=SamplingParams(max_tokens=8), seed=0), HANG_GUARD_S)
    finally:
        await generator.aclose()
    assert trajectory.status == "error" and trajectory.error_kind == ERROR_ENDPOINT, trajectory.error
    assert not trajectory.turns and not any(trajectory.loss_mask)  # nothing sampled was kept


def test_eval_of_a_hostile_endpoint_counts_endpoint_errors_and_finishes(endpoint, tmp_path):
    endpoint.behave(body=completion([VOCAB + 5], [-0.5]))  # a token id the tokenizer cannot decode
    out = tmp_path / "run"
    args = ["eval", "forge_env/Arithmetic-v0", "--model", TINY_MODEL_ID, "--base-url", endpoint.url, "--n-tasks", "2",
            "--max-tokens", "8", "--timeout", "2", "--max-retries", "1", "--backoff", "0.01", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["endpoint_errors"] == 2 and summary["mean_reward"] is None
    assert main([*args, "--fail-on-errors"]) != 0
