"""Rubric: weighted reward functions, metrics, group functions."""

import pytest

from forge_env import Rubric


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


async def short(completion: str) -> float:
    return float(len(completion) < 5)


async def test_weighted_sum_and_metrics():
    rubric = Rubric([exact, short], weights=[1.0, 0.5])
    result = await rubric.score("42", {"answer": "42"})
    assert result.reward == 1.5 and result.metrics == {"exact": 1.0, "short": 1.0}
    result = await rubric.score("it is 42", {"answer": "42"})
    assert result.reward == 0.0 and result.metrics == {"exact": 0.0, "short": 0.0}


async def test_group_function_sees_the_whole_group():
    def rank_by_length(completion: list[str]) -> list[float]:
        shortest = min(len(c) for c in completion)
        return [float(len(c) == shortest) for c in completion]

    rubric = Rubric([exact]).add_group(rank_by_length, weight=0.1)
    results = await rubric.score_group(["42", "42 ", "7"], [{"answer": "42"}] * 3)
    assert [r.reward for r in results] == [1.0, 1.0, 0.1]
    assert results[2].metrics == {"exact": 0.0, "rank_by_length": 1.0}


def test_bad_reward_function_signature_and_duplicates():
    def needs_unknown(completion, weather):
        return 0.0

    with pytest.raises(TypeError, match="asks for \\['weather'\\]"):
        Rubric([needs_unknown])
    with pytest.raises(ValueError, match="already has a function named 'exact'"):
        Rubric([exact, exact])
    with pytest.raises(ValueError, match="2 functions but 1 weights"):
        Rubric([exact, short], weights=[1.0])
