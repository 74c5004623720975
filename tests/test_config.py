"""YAML configs as dataclasses with dotted overrides and specific errors."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from forge_env.config import ConfigError, load_config, to_dict


@dataclass
class Optim:
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])


@dataclass
class App:
    name: str = "run"
    steps: int = 10
    mode: Literal["sync", "async"] = "sync"
    seed: int | None = None
    optim: Optim = field(default_factory=Optim)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text("name: demo\noptim:\n  lr: 0.01\nextra: {a: 1}\n")
    config = load_config(App, path, ["optim.lr=1e-5", "mode=async", "seed=3", "optim.betas=[0.8, 0.9]"])
    assert config.name == "demo" and config.mode == "async" and config.seed == 3
    assert config.optim.lr == 1e-5 and config.optim.betas == [0.8, 0.9]
    assert to_dict(config)["extra"] == {"a": 1}
    assert load_config(App).steps == 10


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1"], "unknown key 'optim.lrr'; did you mean ['lr']"),
        (["steps=ten"], "steps: expected an integer, got 'ten'"),
        (["mode=fast"], "mode: 'fast' is not one of ['sync', 'async']"),
        (["steps=0"], "steps must be >= 1"),
        (["optim=3"], "optim: expected a mapping"),
        (["name.first=x"], "'name' is a value, not a section"),
        (["novalue"], "must look like key.sub=value"),
        (["optim.betas=[a]"], "optim.betas[0]: expected a number"),
        (["optim.betas=[0.8, 0.9"], "the value is not valid YAML"),
    ],
)
def test_errors_name_the_key(overrides, message, tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text("name: x\n")
    with pytest.raises(ConfigError) as error:
        load_config(App, path, overrides)
    assert message in str(error.value)


def test_a_scalar_that_is_not_yaml_is_a_plain_string(tmp_path):
    # "*" alone is a YAML alias marker; as a command-line value it means the string.
    assert load_config(App, None, ["name=*"]).name == "*"
    assert load_config(App, None, ["name=@home"]).name == "@home"


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(App, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(App, bad)


def _alias_bomb(levels=7, width=9):
    """Under 1 KB that expands to width**levels strings (7 levels keep a failure on unfixed code cheap)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    lines.append(f"bomb: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_not_expanded(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert len(path.read_bytes()) < 1200
    with pytest.raises(ConfigError, match="expands to more than"):
        load_config(App, path)
    with pytest.raises(ConfigError, match="refers to itself"):
        path.write_text("loop: &a [*a]\n")
        load_config(App, path)
