"""Generation as a service: sticky sessions pin a replica (and its KV cache), weights fan out to all."""

import pytest

from forge_env.generation import Generator, SamplingParams
from forge_env.generation.service import GeneratorService
from forge_env.models import TINY_MODEL_ID, build_byte_tokenizer
from tests.generator_weights import tiny_weights


def prompt(text):
    return build_byte_tokenizer().apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )["input_ids"]


async def play_turns(gen, session_id, turns=3):
    """A few turns of one session; returns the completions."""
    tokens, completions = prompt(f"episode {session_id}"), []
    for turn in range(turns):
        completion = await gen.generate(
            tokens, SamplingParams(max_tokens=8, seed=turn), session_id=session_id
        )
        completions.append(completion)
        tokens = tokens + completion.token_ids + prompt("observation")
    return completions


@pytest.mark.parametrize("service_backend", ["local", "monarch"])
async def test_sessions_stick_to_the_replica_holding_their_cache(service_backend):
    async with await GeneratorService.launch(
        TINY_MODEL_ID, num_replicas=2, service_backend=service_backend, weight_source=tiny_weights
    ) as gen:
        assert isinstance(gen, Generator)
        for session in ["a", "b"]:
            completions = await play_turns(gen, session)
            for previous, current in zip(completions, completions[1:], strict=False):
                assert current.num_cached_tokens == len(previous.prompt_ids) + len(previous.token_ids)
        stats = await gen.stats()
        assert sorted(s["session_hits"] for s in stats) == [2, 2]  # one session per replica, every turn a hit
        sessionless = await gen.generate(prompt("hi"), SamplingParams(max_tokens=4))
        assert sessionless.num_cached_tokens == 0

        await gen.release_session("a")
        await gen.release_session("b")
        assert [s["sessions"] for s in await gen.stats()] == [0, 0]

        await gen.update_weights(1)
        assert gen.policy_version == 1
        after = await gen.generate(prompt("hi"), SamplingParams(max_tokens=4), session_id="c")
        assert after.policy_version == 1
        assert [s["policy_version"] for s in await gen.stats()] == [1, 1]
