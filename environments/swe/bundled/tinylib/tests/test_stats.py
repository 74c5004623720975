import pytest

from tinylib.stats import clamp, mean, median, percentile, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    with pytest.raises(ValueError):
        mean([])


def test_median_odd_and_even():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5


def test_variance():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(4.571428571)
    with pytest.raises(ValueError):
        variance([1])


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-2, 0, 3) == 0
    assert clamp(2, 0, 3) == 2
    assert clamp(3, 0, 3) == 3
    with pytest.raises(ValueError):
        clamp(1, 3, 0)


def test_percentile():
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([1, 2, 3, 4], 0.25) == pytest.approx(1.75)
    assert percentile([10, 20], 1) == 20
    assert percentile([10, 20], 0) == 10
