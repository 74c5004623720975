"""Every (round, group, episode, turn) samples from its own reproducible random stream."""

import pytest

import forge_env
from agents.groups import GroupRequest, stream_groups
from forge_env.chat import ChatRenderer
from forge_env.generation.base import SamplingParams, derive_seed
from forge_env.generation.hf import HFGenerator, HFGeneratorConfig
from forge_env.models import build_byte_tokenizer, build_tiny_model

STOP_ON_LETTERS = tuple(range(ord("a"), ord("z") + 1))  # short turns, so episodes have several


class SeedRecorder:
    """The real generator, noting the sampling seed of every call by episode session."""

    def __init__(self, generator):
        self.generator = generator
        self.seeds: list[tuple[str, int]] = []

    async def generate(self, prompt_ids, sampling, session_id=None):
        self.seeds.append((session_id, sampling.seed))
        return await self.generator.generate(prompt_ids, sampling, session_id=session_id)

    async def release_session(self, session_id):
        await self.generator.release_session(session_id)

    def __getattr__(self, name):
        return getattr(self.generator, name)


@pytest.fixture(scope="module")
def kit():
    tokenizer = build_byte_tokenizer()
    generator = HFGenerator(build_tiny_model(seed=0), tokenizer, HFGeneratorConfig(max_batch_size=16))
    yield generator, ChatRenderer(tokenizer)
    generator.close()


def math_env():
    return forge_env.make("forge_env/Math-v0", max_attempts=3, max_turns=3)


async def play_round(generator, renderer, round_seed):
    recorder = SeedRecorder(generator)
    sampling = SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=STOP_ON_LETTERS, seed=round_seed)
    requests = [GroupRequest(seed=task, n=3) for task in range(3)]
    async for _ in stream_groups(requests, math_env, recorder, renderer, sampling=sampling):
        pass
    return recorder.seeds


async def test_no_two_turns_of_a_round_share_a_seed_and_rounds_reproduce(kit):
    generator, renderer = kit
    seeds = await play_round(generator, renderer, round_seed=derive_seed(0, "round", 0))
    calls = len(seeds)
    assert calls > 9  # 3 groups x 3 episodes, several turns each
    assert len({seed for _, seed in seeds}) == calls  # groups, episodes and turns all draw differently
    again = await play_round(generator, renderer, round_seed=derive_seed(0, "round", 0))
    assert sorted(s for _, s in again) == sorted(s for _, s in seeds)
    next_round = await play_round(generator, renderer, round_seed=derive_seed(0, "round", 1))
    assert not {s for _, s in next_round} & {s for _, s in seeds}


def test_derived_seeds_differ_by_every_key():
    base = SamplingParams(seed=5)
    keys = [("group", g, "episode", e, "turn", t) for g in range(4) for e in range(4) for t in range(4)]
    assert len({base.derived(*k).seed for k in keys}) == len(keys)
    assert SamplingParams(seed=None).derived("turn", 1).seed is None
