"""The suite fails closed: without bubblewrap or a Docker engine, the sandbox's tests fail where those could be
installed (root with apt-get) and elsewhere skip loudly, listed with their reasons at the end of the run; the
Makefile's install steps fail as root with apt-get when the install fails.

Each check runs the real thing in a subprocess (pytest on real sandbox test modules, ``make``, the docker
script) with a PATH that lacks bwrap (a directory of links to every other program) and a Docker host that
does not answer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import trust_boundary
from tests.docker_support import requires_docker

ROOT = Path(__file__).resolve().parent.parent
#: Real trust-boundary tests: a bubblewrap one, and one on both backends.
TARGETS = ["tests/test_sandbox_session.py::test_errors_keep_state", "tests/test_sandbox_hostile.py::test_memory_hog"]


def path_without(tmp_path: Path, hidden: set[str], stubs: dict[str, str] | None = None) -> str:
    """A PATH with every program of the current one except ``hidden``, plus shell-script ``stubs``."""
    links = tmp_path / "bin"
    links.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            if name in hidden or (links / name).exists() or not os.access(target, os.X_OK):
                continue
            (links / name).symlink_to(target)
    path = str(links)
    if stubs:
        stub_dir = tmp_path / "stubs"
        stub_dir.mkdir()
        for name, script in stubs.items():
            (stub_dir / name).write_text(f"#!/bin/sh\n{script}\n")
            (stub_dir / name).chmod(0o755)
        path = f"{stub_dir}{os.pathsep}{path}"
    return path


def run_suite(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path_without(tmp_path, {"bwrap"}),
           "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    for variable in ("FORGE_ENV_REQUIRE_BWRAP", "FORGE_ENV_REQUIRE_DOCKER"):
        env.pop(variable, None)
        if require is not None:
            env[variable] = require
    assert shutil.which("bwrap", path=env["PATH"]) is None
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TARGETS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


@pytest.mark.parametrize("require", ["1", "0", None], ids=["required", "not-required", "default"])
def test_missing_bwrap_and_docker_fail_where_required_and_skip_loudly_elsewhere(tmp_path, require):
    result = run_suite(tmp_path, require)
    output = result.stdout + result.stderr
    required = require == "1" or (require is None and _can_install())
    assert "!!! trust boundary !!!" in output.replace("!!!!", "!!!"), output[-3000:]
    if required:
        assert result.returncode == 1, output[-3000:]
        assert "3 errors" in output and "passed" not in output and "skipped" not in output, output[-3000:]
        assert "3 tests of the sandbox's trust boundary FAILED for a missing component" in output
        assert "bwrap is required here" in output and "bubblewrap (bwrap) is not on PATH" in output
        assert "docker is required here" in output and "no Docker engine answers" in output
    else:
        assert result.returncode == 0, output[-3000:]
        assert "3 skipped" in output, output[-3000:]
        summary = output[output.index("trust boundary !"):]  # printed at the end, after every test
        assert "3 tests of the sandbox's trust boundary were SKIPPED, not run:" in summary
        assert "2 x bwrap: bubblewrap (bwrap) is not on PATH" in summary  # the session test, hostile[process]
        assert "1 x docker: docker backend: no Docker engine answers" in summary


def test_the_rule(monkeypatch):
    """Required: =1, or unset as root with apt-get; not: =0, or unset elsewhere; anything else is refused."""
    monkeypatch.delenv("FORGE_ENV_REQUIRE_BWRAP", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/usr/bin/apt-get" if name == "apt-get" else None)
    assert trust_boundary.required("bwrap")[0]
    monkeypatch.setenv("FORGE_ENV_REQUIRE_BWRAP", "0")
    assert not trust_boundary.required("bwrap")[0]
    monkeypatch.setenv("FORGE_ENV_REQUIRE_BWRAP", "yes")
    with pytest.raises(pytest.UsageError, match="must be 1 .* or 0"):
        trust_boundary.required("bwrap")
    monkeypatch.delenv("FORGE_ENV_REQUIRE_BWRAP")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert not trust_boundary.required("bwrap")[0]
    monkeypatch.setenv("FORGE_ENV_REQUIRE_BWRAP", "1")
    assert trust_boundary.required("bwrap")[0]
    with pytest.raises(ValueError, match="unknown trust-boundary component"):
        trust_boundary.requires("podman", None)


FAILING_APT = "echo 'apt-get: (test stub) no network' >&2; exit 100"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("uid", ["0", "1000"], ids=["root", "not-root"])
def test_make_fails_when_an_install_that_could_work_fails(tmp_path, uid):
    """As root with apt-get, a failed install of bubblewrap (for make test) or Docker fails make; not as root,
    it warns. ``id`` and ``apt-get`` are stubs: nothing is installed."""
    path = path_without(tmp_path, {"bwrap", "dockerd", "debootstrap", "apt-get", "id"},
                        {"apt-get": FAILING_APT, "id": f"echo {uid}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_ENV_REQUIRE_")} | {"PATH": path}
    make = [shutil.which("make"), "-s", "--no-print-directory", "-C", str(ROOT)]
    root = uid == "0"

    strict = subprocess.run([*make, "system-deps", "STRICT_DEPS=1"], env=env, capture_output=True, text=True)
    assert (strict.returncode != 0) == root, strict.stderr
    assert ("error: could not install bubblewrap" in strict.stderr) == root, strict.stderr
    if not root:
        assert "WARNING: bwrap not found and not installable here" in strict.stderr
    demo = subprocess.run([*make, "system-deps"], env=env, capture_output=True, text=True)  # make demo: a warning
    assert demo.returncode == 0 and "WARNING" in demo.stderr, demo.stderr
    opted_out = subprocess.run([*make, "system-deps", "STRICT_DEPS=1"], env=env | {"FORGE_ENV_REQUIRE_BWRAP": "0"},
                               capture_output=True, text=True)
    assert opted_out.returncode == 0, opted_out.stderr

    docker = subprocess.run([str(ROOT / "tools/docker_engine.sh"), "install"], env=env, capture_output=True, text=True)
    assert (docker.returncode != 0) == root, docker.stderr
    assert ("the docker tests will FAIL" if root else "the docker tests will SKIP") in docker.stderr, docker.stderr


#: A docker CLI whose engine answers but lacks every image (``docker image inspect`` fails).
ENGINE_WITHOUT_IMAGES = 'case "$1" in info) exit 0;; image) exit 1;; *) echo "docker stub: $*" >&2; exit 1;; esac'


@pytest.mark.parametrize("uid", ["0", "1000"], ids=["root", "not-root"])
@pytest.mark.parametrize("which", ["image", "swe-image"])
def test_an_image_that_fails_to_build_where_the_engine_answers_fails_where_docker_is_required(tmp_path, uid, which):
    """Issue 47 item 2: tools/docker_engine.sh image / swe-image exit 1 when the build fails as root with apt-get
    (the docker tests are required there), and warn with exit 0 elsewhere. Stubs: nothing is built."""
    path = path_without(tmp_path, {"docker", "debootstrap", "apt-get", "id"},
                        {"docker": ENGINE_WITHOUT_IMAGES, "debootstrap": "echo 'debootstrap: (test stub) no mirror'; exit 1",
                         "apt-get": FAILING_APT, "id": f"echo {uid}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_ENV_REQUIRE_")} | {"PATH": path}
    done = subprocess.run([str(ROOT / "tools/docker_engine.sh"), which], env=env, capture_output=True, text=True)
    opted_out = subprocess.run([str(ROOT / "tools/docker_engine.sh"), which], env=env | {"FORGE_ENV_REQUIRE_DOCKER": "0"},
                               capture_output=True, text=True)
    for log in re.findall(r"/var/tmp/forge-env-rootfs\.\w+\.log", done.stderr + opted_out.stderr):
        os.unlink(log)  # the script keeps a failed build's log for a person to read
    root = uid == "0"
    assert (done.returncode != 0) == root, done.stderr
    assert "debootstrap failed" in done.stderr, done.stderr
    assert ("the docker tests will FAIL" if root else "the docker tests will SKIP") in done.stderr, done.stderr
    assert opted_out.returncode == 0, opted_out.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("failing", ["image", "swe-image"])
def test_make_test_stops_when_an_image_fails_to_build(tmp_path, failing):
    """Issue 47 item 2: `make test` runs the suite only after both images built (``&&``, not ``;``): the engine
    script's failure (it fails only where the images are required) fails the target. Its prerequisites are
    taken as done (``-o``); the engine script and the interpreter are stubs."""
    engine = tmp_path / "engine.sh"
    engine.write_text(f'#!/bin/sh\necho "engine $*" >&2\n[ "$1" = {failing} ] && exit 1\nexit 0\n')
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {tmp_path}/suite-ran\n")
    for stub in (engine, python):
        stub.chmod(0o755)
    done = subprocess.run([shutil.which("make"), "-s", "--no-print-directory", "-C", str(ROOT), "-o", "install",
                           "-o", "docker-deps", "test", f"DOCKER_ENGINE={engine}", f"PY={python}"],
                          capture_output=True, text=True)
    assert done.returncode != 0, done.stderr
    assert not (tmp_path / "suite-ran").exists()
    assert "engine stop" in done.stderr  # the engine started for the suite is stopped all the same


@requires_docker
@pytest.mark.parametrize("require", ["1", "0"], ids=["required", "not-required"])
def test_a_missing_swe_image_fails_the_swe_docker_tests_where_required(tmp_path, require):
    """Issue 47 item 2: SWE-v0's docker tests without SWE-v0's image (here: an image name the engine lacks) fail
    where the docker tests are required, and skip, listed at the end, elsewhere; they skipped quietly before."""
    target = "tests/test_swe_redteam.py::test_a_test_helper_module_is_test_infrastructure[docker]"
    env = {**os.environ, "FORGE_ENV_SWE_IMAGE": "forge-env/no-such-swe-image:never", "FORGE_ENV_REQUIRE_DOCKER": require}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", target], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    if require == "1":
        assert result.returncode == 1 and "1 error" in output, output[-3000:]
        assert "docker is required here" in output and "SWE-v0's image forge-env/no-such-swe-image:never" in output
    else:
        assert result.returncode == 0 and "1 skipped" in output, output[-3000:]
        assert "1 x docker: SWE-v0's docker backend: the engine lacks SWE-v0's image" in output, output[-3000:]


def test_no_test_skips_for_a_missing_package_that_make_test_installs():
    """Issue 47 item 2: a package of forge-env's dependencies or of an extra `make test` installs is
    imported outright by the tests that need it, never skipped on (``importorskip``, ``find_spec(...) is
    None``): a broken install then fails the suite instead of quietly testing less."""
    import importlib.metadata
    import tomllib

    def name(requirement: str) -> str:
        return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0]).lower()

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The extras `make install` installs, read from the Makefile (dev, engines-cpu, ...).
    extras = re.search(r"pip install -q -e '\.\[([\w,-]+)\]'", (ROOT / "Makefile").read_text()).group(1).split(",")
    assert "dev" in extras and "engines-cpu" in extras, extras
    installed = {name(r) for r in project["dependencies"]}
    installed |= {name(r) for extra in extras for r in project["optional-dependencies"][extra]}
    distributions = importlib.metadata.packages_distributions()
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for module in re.findall(r"""(?:importorskip|find_spec)\(\s*["']([\w.]+)["']""", path.read_text()):
            dists = {name(d) for d in distributions.get(module.split(".")[0], [])}
            if dists & installed:
                found.append(f"{path.name}: {module} ({', '.join(sorted(dists))})")
    assert not found, found
