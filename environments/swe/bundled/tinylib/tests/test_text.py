import pytest

from tinylib.text import count_words, slugify, truncate, wrap


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  many   spaces ") == "many-spaces"
    assert slugify("abc") == "abc"


def test_truncate():
    assert truncate("hello world", 8) == "hello..."
    assert truncate("short", 10) == "short"
    assert truncate("exact", 5) == "exact"
    with pytest.raises(ValueError):
        truncate("text", 2)


def test_wrap():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]
    assert wrap("", 5) == []
    assert wrap("abcdef", 3) == ["abcdef"]


def test_count_words():
    assert count_words("A a b. B, c!") == {"a": 2, "b": 2, "c": 1}
