"""A tiny git repository with a bug, its SWE-bench row, and helpers to play SWE-v0 episodes in tests.

The mirror's history goes past ``base_commit``: the commit after it holds the fix and the hidden tests
(as a real mirror's does), and a branch ``answers`` holds them too, so tests can prove neither is
reachable from the workspace.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from environments.swe.env import SANDBOX_DEFAULTS, SANDBOX_PACKAGES, swe_image
from forge_env.sandbox import make_sandbox
from forge_env.types import assistant_message, make_tool_call
from forge_env.workspace import close_spares
from tests.docker_support import ENGINE, requires_docker
from tests.sandbox_support import requires_bwrap
from tests.trust_boundary import requires


def _swe_image_missing() -> str | None:
    if ENGINE is None:
        return None  # requires_docker says why
    try:
        ENGINE.images.get(swe_image())
    except Exception as exc:
        return f"the engine lacks SWE-v0's image {swe_image()} ({exc}); run `tools/docker_engine.sh swe-image`"
    return None


#: Both sandbox backends, for the SWE-v0 suites (docker needs the SWE image: python3, git, pytest).
#: The SWE image is part of the docker trust boundary: missing where the docker tests are required (root with
#: apt-get, where `make test` builds it), the docker runs fail, as for the sandbox image (tests/trust_boundary.py).
SWE_IMAGE_MISSING = _swe_image_missing()
requires_swe_image = requires("docker", SWE_IMAGE_MISSING and f"SWE-v0's docker backend: {SWE_IMAGE_MISSING}")
SWE_BACKENDS = [pytest.param("process", marks=requires_bwrap),
                pytest.param("docker", marks=[pytest.mark.docker, requires_docker, requires_swe_image])]

OPS = '''"""Small numeric helpers."""


def add(a, b):
    return a + b


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(xs):
    return sum(xs) / (len(xs) - 1)


def span(xs):
    return max(xs) - min(xs) + 1
'''
FIXED_OPS = OPS.replace("(len(xs) - 1)", "len(xs)").replace("min(xs) + 1", "min(xs)")
TEST_OPS = '''from calc.ops import add, clamp


def test_add():
    assert add(2, 3) == 5


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
'''
TEST_STATS = '''from calc.ops import mean, span


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_span():
    assert span([1, 5, 2]) == 4
'''
FAIL_TO_PASS = ["tests/test_stats.py::test_mean", "tests/test_stats.py::test_span"]
PASS_TO_PASS = ["tests/test_ops.py::test_add", "tests/test_ops.py::test_clamp"]


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    env = {"PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                          check=True).stdout


def make_mirror(repos_dir: Path) -> dict[str, Any]:
    """Build ``repos_dir/acme__calc`` and return its SWE-bench row."""
    repo = repos_dir / "acme__calc"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(OPS)
    (repo / "tests" / "test_ops.py").write_text(TEST_OPS)
    (repo / "README.md").write_text("calc: small numeric helpers\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc" / "ops.py").write_text(FIXED_OPS)
    patch = git(repo, "diff")
    (repo / "tests" / "test_stats.py").write_text(TEST_STATS)
    git(repo, "add", "-N", "tests/test_stats.py")
    test_patch = git(repo, "diff", "--", "tests")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fix mean and span (the answer)")
    fix = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "branch", "answers")
    return {"instance_id": "acme__calc-1", "repo": "acme/calc", "base_commit": base, "fix_commit": fix,
            "problem_statement": "mean() and span() give wrong results: mean([1, 2, 3]) is 3.0, not 2.",
            "patch": patch, "test_patch": test_patch, "FAIL_TO_PASS": list(FAIL_TO_PASS),
            "PASS_TO_PASS": list(PASS_TO_PASS), "hints_text": ""}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant turn with one tool call."""
    return assistant_message("", [make_tool_call(name, arguments)])


async def play(env: Any, row: dict[str, Any], *turns: dict[str, Any], submit: bool = True
               ) -> tuple[float, dict[str, Any], list[str]]:
    """Play ``turns`` (tool calls) then submit; return (final reward, final info, tool outputs)."""
    await env.areset(options={"task": row})
    outputs: list[str] = []
    reward, info = 0.0, {}
    for turn in [*turns, *([call("submit")] if submit else [])]:
        observation, reward, terminated, truncated, info = await env.astep(turn)
        outputs.extend(m.get("content") or "" for m in observation)
        if terminated or truncated:
            break
    return reward, info, outputs


#: Smaller than the env's defaults so that hostile commands hit the limits quickly.
TEST_SANDBOX = SANDBOX_DEFAULTS | {"workdir_size_mb": 64, "file_size_mb": 32, "max_processes": 48, "max_concurrency": 2}


def swe_test_sandbox(backend: str, packages: tuple[str, ...] = ()):
    """``packages``: what the repository under test needs in the process backend's interpreter, besides pytest."""
    backend_options = ({"isolation": "bwrap", "packages": (*SANDBOX_PACKAGES, *packages)} if backend == "process"
                       else {"image": swe_image()})
    return make_sandbox(backend, **TEST_SANDBOX, **backend_options)


def swe_sandbox(backend: str, packages: tuple[str, ...] = ()):
    """The body of a module-scoped ``sandbox`` fixture (``yield from swe_sandbox(request.param)``): the test
    sandbox, closed with its spare sessions afterwards."""
    box = swe_test_sandbox(backend, packages)
    yield box
    close_spares(box)
    asyncio.run(box.close())


def mirror_in(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """The body of a module-scoped ``mirror`` fixture: a fresh repos dir holding the test mirror, and its row."""
    repos = tmp_path_factory.mktemp("repos")
    return repos, make_mirror(repos)
