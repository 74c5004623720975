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


def test_a_namespace_makes_every_id_under_its_prefix(capsys):
    from tests.guess_env import GuessEnv

    made = []

    def factory(name, **kwargs):
        made.append((name, kwargs))
        return GuessEnv(high=int(name), **kwargs)

    forge_env.register_namespace("tests-guess", factory, description="guess 1..<name>")
    env = forge_env.make("tests-guess:7")
    assert env.high == 7 and env.spec_id == "tests-guess:7" and made == [("7", {})]
    forge_env.make("tests-guess:3", max_turns=2)
    assert made[-1] == ("3", {"max_turns": 2})
    assert forge_env.namespaces()["tests-guess"].description == "guess 1..<name>"
    forge_env.register_namespace("tests-lazy", "tests.guess_env:GuessEnv")  # a string is imported on first use
    assert forge_env.make("tests-lazy:12").high == "12"  # the name is the factory's first argument
    with pytest.raises(UnknownEnvironmentError, match="write tests-guess:<name>"):
        forge_env.make("tests-guess:")
    with pytest.raises(UnknownEnvironmentError, match="tests-guess:<name>"):
        forge_env.make("tests-gues:7")  # an unknown prefix is an unknown id, and the namespaces are listed
    for bad in ("", "a:b", "a/b"):
        with pytest.raises(ValueError, match="plain word"):
            forge_env.register_namespace(bad, factory)
    assert "verifiers" in forge_env.namespaces()  # the built-in plugin registers verifiers:<taskset-id>
    from agents.cli import main

    assert main(["list"]) == 0
    assert "verifiers:<name>" in capsys.readouterr().out


def test_import_loads_no_plugin_and_make_loads_them_on_first_lookup():
    """``import forge_env`` runs no entry point (nor imports ``environments``); the first ``make`` does."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]  # this checkout's forge_env, not an installed one

    script = """
import importlib.metadata as metadata
import sys
groups = []
real = metadata.entry_points
def spy(*args, **kwargs):
    groups.append(kwargs.get("group"))
    return real(*args, **kwargs)
metadata.entry_points = spy
import forge_env
assert groups == [] and "environments" not in sys.modules, (groups, "environments" in sys.modules)
env = forge_env.make("forge_env/Math-v0")
assert groups == ["forge_env.environments"] and "environments" in sys.modules, groups
assert type(env).__name__ == "MathEnv", type(env)
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
