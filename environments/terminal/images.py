"""The images a Terminal-v0 task runs in, built with the local Docker engine, offline, cached by content.

1. The task image: ``environment/`` built as it is (``forge-env/terminal-task:<hash of environment/>``), or
   ``[environment].docker_image`` when the task names a prebuilt one. Builds run with no network and never
   pull: a Dockerfile's ``FROM`` must name an image the engine already has.
2. The agent image, one layer on top (``forge-env/terminal-agent:<hash>``): the working directory is given to
   the agent's unprivileged uid (:data:`AGENT_UID`), ``/tests`` and ``/logs`` are removed, and outside the
   working directory and the sticky temporary directories nothing stays writable by the agent: no
   world-writable file or directory, nothing owned by the agent's uid or gid. So the agent cannot replace a
   program the verifier runs (``bash``, ``python3``, anything on ``PATH``), plant ``/tests`` or
   ``/logs/verifier``, or touch system configuration. A task whose ``PATH`` (or ``LD_LIBRARY_PATH``,
   ``LD_PRELOAD``, ``BASH_ENV``, ``ENV``; the image's or ``[verifier].env``'s) names a path the agent can
   write (its working directory, a temporary directory, a relative path or, as an empty entry, the current
   directory) is refused: its verifier would run the agent's code.

An image is built once per content: the tag is a hash of what went into it, so a changed task builds anew
and an unchanged one is found in the engine. Building needs ``/bin/sh`` and ``python3`` in the task image
(``python3`` also runs the sandbox's server in the agent's container).
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.terminal.tasks import TerminalTask, TerminalTaskError, tree_digest
from forge_env.sandbox.base import SandboxUnavailableError
from forge_env.sandbox.docker_engine import docker_module, engine_errors, explain

AGENT_UID = 10001
TASK_REPO = "forge-env/terminal-task"
AGENT_REPO = "forge-env/terminal-agent"
#: Writable by anyone in the images (sticky): the agent's temporary files; never on a verifier's PATH.
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
#: Where a working directory may not be (the agent would own system files).
SYSTEM_DIRS = ("/", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/etc", "/var", "/proc", "/sys", "/dev", "/boot",
               "/root", "/run", "/tests", "/logs", *TEMP_DIRS)
#: Variables that decide what code every program (or shell) of the verifier runs: none may name a path the
#: agent can write (its working directory, a temporary directory, a relative path or the current directory).
SEARCH_VARS = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "BASH_ENV", "ENV")
#: Bumped when the agent layer's recipe changes (part of its content hash).
RECIPE_VERSION = 1

#: Run as root while the agent layer is built: hand the working directory to the agent, take everything
#: else away from it (see the module docstring). argv: workdir, uid.
LOCKDOWN = r'''
import os, shutil, stat, sys
workdir, uid = sys.argv[1], int(sys.argv[2])
temp = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
try:  # a user of the image with the agent's uid would bring its groups (and their permissions) along
    for line in open("/etc/passwd"):
        fields = line.split(":")
        if len(fields) > 3 and fields[2] == str(uid):
            sys.exit("the image already has a user with uid %d (%s): the agent's uid must be its own" % (uid, fields[0]))
except FileNotFoundError:
    pass
for gone in ("/tests", "/logs"):
    if os.path.lexists(gone):
        if os.path.isdir(gone) and not os.path.islink(gone):
            shutil.rmtree(gone)
        else:
            os.unlink(gone)
os.makedirs(workdir, exist_ok=True)
workdir = os.path.realpath(workdir)
skip = {"/proc", "/sys", "/dev", workdir}
fixed = 0
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    for name in dirs + files:
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if path in temp:  # the sticky temporary directories stay writable (their files are fixed below them)
            continue
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid == uid or info.st_gid == uid:
                os.lchown(path, 0, 0)
            continue
        if info.st_uid == uid or info.st_gid == uid:
            os.chown(path, 0, 0)
            fixed += 1
        if info.st_mode & 0o002:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o002)
            fixed += 1
info = os.lstat("/")
if info.st_mode & 0o022 or info.st_uid != 0:
    os.chown("/", 0, 0)
    os.chmod("/", 0o755)
for top, dirs, files in os.walk(workdir):
    for name in [top] + [os.path.join(top, n) for n in dirs + files]:
        info = os.lstat(name)
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:  # a hard link to a file elsewhere: copy it apart
            shutil.copy2(name, name + ".forge-unlink")
            os.replace(name + ".forge-unlink", name)
        os.lchown(name, uid, uid)
os.chmod(workdir, 0o755)
print("lockdown: %d permission(s) taken from the agent" % fixed)
'''

_build_lock = threading.Lock()


@dataclass(frozen=True)
class TaskImages:
    """The images of one task: the agent's (what its container starts from) and its settings."""

    task_image: str
    agent_image: str
    workdir: str
    env: dict[str, str]


def _client() -> Any:
    docker = docker_module()
    try:
        client = docker.from_env()
        client.ping()
    except engine_errors() as exc:
        raise SandboxUnavailableError(f"Terminal-v0 needs a Docker engine; none answers ({explain(exc)}); start "
                                      f"one with `tools/docker_engine.sh start`") from None
    return client


def _has(client: Any, ref: str) -> Any:
    docker = docker_module()
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


def _context(files: dict[str, tuple[bytes, int]], directory: Path | None = None) -> bytes:
    """A gzip-less tar build context: ``directory``'s files, then ``files`` (name -> (bytes, mode))."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if directory is not None:
            tar.add(directory, arcname=".")
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _build(client: Any, context: bytes, tag: str, timeout: float, what: str) -> None:
    docker = docker_module()
    log: list[str] = []
    try:
        for chunk in client.api.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag, rm=True,
                                      forcerm=True, pull=False, network_mode="none", decode=True, timeout=timeout):
            if "stream" in chunk:
                log.append(chunk["stream"])
            if "error" in chunk:
                tail = "".join(log)[-1500:]
                raise TerminalTaskError(f"{what}: the image build failed: {chunk['error'].strip()}\n{tail}")
    except docker.errors.APIError as exc:
        raise TerminalTaskError(f"{what}: the Docker engine refused the build: {explain(exc)}") from None
    except engine_errors() as exc:
        raise SandboxUnavailableError(f"{what}: the Docker engine failed during the build: {explain(exc)}") from None


def task_image(client: Any, task: TerminalTask) -> str:
    """The task's own image (built from ``environment/`` unless it names a prebuilt one)."""
    if task.docker_image:
        if _has(client, task.docker_image) is None:
            raise TerminalTaskError(f"{task.name}: [environment].docker_image {task.docker_image!r} is not in the "
                                    f"Docker engine (Terminal-v0 never pulls: load or build it first)")
        return task.docker_image
    tag = f"{TASK_REPO}:{tree_digest(task.environment_dir)[:24]}"
    if _has(client, tag) is None:
        _build(client, _context({}, task.environment_dir), tag, task.build_timeout_s, f"{task.name} environment/")
    return tag


def _image_env(config: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in config.get("Env") or []:
        key, _, value = item.partition("=")
        env[key] = value
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _entries(name: str, value: str | None) -> list[str]:
    """The paths a search variable names (an empty entry of a list is the current directory: kept as '')."""
    if value is None:
        return []
    if name in ("BASH_ENV", "ENV"):
        return [value] if value else []
    if name == "LD_PRELOAD":
        return [e for e in re.split(r"[:\s]+", value) if e]
    return re.split(r"[:;]", value) if name == "LD_LIBRARY_PATH" else value.split(":")


def _inside(path: str, directory: str) -> bool:
    path, directory = posixpath.normpath(path), posixpath.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def agent_image(client: Any, task: TerminalTask, base: str) -> TaskImages:
    """The locked-down layer on ``base`` (see the module docstring), built once per content."""
    config = client.images.get(base).attrs.get("Config") or {}
    env = _image_env(config)
    workdir = posixpath.normpath(task.workdir or config.get("WorkingDir") or "/app")
    if workdir == "/":
        workdir = "/app"
    if workdir in SYSTEM_DIRS or any(_inside(workdir, d) for d in ("/proc", "/sys", "/dev", "/tests", "/logs",
                                                                    "/etc", "/usr", "/bin", "/sbin", "/lib")):
        raise TerminalTaskError(f"{task.name}: the working directory {workdir!r} is a system directory; the agent "
                                f"would own it (set [environment].workdir or WORKDIR to a directory of its own)")
    volumes = sorted(config.get("Volumes") or {})
    if volumes:
        raise TerminalTaskError(f"{task.name}: the task image declares VOLUME {', '.join(volumes)}: a volume is not part "
                                f"of the agent's committed file system (what the agent writes there never reaches the "
                                f"verifier), and the agent layer cannot lock it down. Remove the VOLUME instruction.")
    for name in SEARCH_VARS:  # the image's and the verifier's own ([verifier].env)
        for value in (env.get(name), task.verifier_env.get(name)):
            for entry in _entries(name, value):
                if not posixpath.isabs(entry) or any(_inside(entry, d) for d in (workdir, *TEMP_DIRS)):
                    raise TerminalTaskError(
                        f"{task.name}: {name} holds {entry!r}, which the agent can write (it is in the working "
                        f"directory {workdir} or a temporary directory, or relative: an empty entry is the current "
                        f"directory): the verifier would run the agent's code. Install tools outside {workdir}.")
    base_id = client.images.get(base).id
    key = json.dumps([RECIPE_VERSION, base_id, workdir, AGENT_UID, hashlib.sha256(LOCKDOWN.encode()).hexdigest()])
    tag = f"{AGENT_REPO}:{hashlib.sha256(key.encode()).hexdigest()[:24]}"
    if _has(client, tag) is None:
        dockerfile = (f"FROM {base_id}\nUSER root\nCOPY lockdown.py /forge-lockdown.py\n"
                      f"RUN python3 -I /forge-lockdown.py {json.dumps(workdir)} {AGENT_UID} && rm /forge-lockdown.py\n"
                      f"WORKDIR {workdir}\nENTRYPOINT []\nCMD []\n")
        context = _context({"Dockerfile": (dockerfile.encode(), 0o644), "lockdown.py": (LOCKDOWN.encode(), 0o644)})
        _build(client, context, tag, task.build_timeout_s, f"{task.name} agent layer")
    return TaskImages(task_image=base, agent_image=tag, workdir=workdir, env=env)


def prepare(task: TerminalTask, client: Any = None) -> TaskImages:
    """Build (or find) the task's images; one build at a time per process."""
    client = client or _client()
    with _build_lock:
        return agent_image(client, task, task_image(client, task))
