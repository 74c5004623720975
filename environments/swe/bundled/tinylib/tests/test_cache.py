import pytest

from tinylib.cache import LRUCache


def test_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None
    assert cache.get("a") == 1 and cache.get("c") == 3
    assert len(cache) == 2


def test_counts_hits_and_misses():
    cache = LRUCache(1)
    cache.put("x", 1)
    cache.get("x")
    cache.get("y")
    assert (cache.hits, cache.misses) == (1, 1)


def test_update_keeps_size():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("a", 2)
    assert len(cache) == 1 and cache.get("a") == 2
    with pytest.raises(ValueError):
        LRUCache(0)
