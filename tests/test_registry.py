"""register / make / specs, gymnasium.make and entry-point plugins."""

import gymnasium
import pytest

import forge_env
from forge_env.core.registry import ENTRY_POINT_GROUP, UnknownEnvironmentError


def test_register_make_and_override_defaults():
    forge_env.register("tests/GuessTen-v0", "tests.guess_env:GuessEnv", description="guess 1..10", high=10)
    assert forge_env.make("tests/GuessTen-v0").high == 10
    assert forge_env.make("tests/GuessTen-v0", high=3).high == 3
    assert forge_env.specs()["tests/GuessTen-v0"].description == "guess 1..10"
    env = gymnasium.make("tests/GuessTen-v0", high=4)
    assert env.unwrapped.high == 4


def test_unknown_id_suggests_close_matches():
    forge_env.register("tests/GuessTen-v0", "tests.guess_env:GuessEnv")
    with pytest.raises(UnknownEnvironmentError, match="Did you mean \\['tests/GuessTen-v0'"):
        forge_env.make("tests/GuesTen-v0")


def test_bad_entry_point_string():
    forge_env.register("tests/Broken-v0", "tests.guess_env.GuessEnv")
    with pytest.raises(ValueError, match="must look like 'package.module:ClassName'"):
        forge_env.make("tests/Broken-v0")


def test_builtin_environments_arrive_through_the_entry_point_group():
    from importlib.metadata import entry_points

    names = {ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert "environments:register_environments" in names
