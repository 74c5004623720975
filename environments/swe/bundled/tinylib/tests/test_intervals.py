from tinylib.intervals import contains, merge, overlaps, total_length


def test_overlaps():
    assert overlaps((1, 3), (3, 5))
    assert not overlaps((1, 2), (4, 5))


def test_merge():
    assert merge([(6, 8), (1, 3), (2, 4)]) == [(1, 4), (6, 8)]
    assert merge([(1, 2), (3, 4)]) == [(1, 4)]
    assert merge([(1, 2), (4, 5)]) == [(1, 2), (4, 5)]
    assert merge([]) == []


def test_total_length():
    assert total_length([(1, 3), (2, 5)]) == 5
    assert total_length([(0, 0)]) == 1


def test_contains():
    assert contains([(1, 3), (7, 9)], 8)
    assert not contains([(1, 3), (7, 9)], 5)
    assert contains([(1, 3)], 3)
