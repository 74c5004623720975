"""Helpers for the docker backend's tests: is an engine with the sandbox image here (and if not, why),
and a private dockerd that a test may kill and restart without touching the engine everything else uses."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time

import docker  # the dev extra ships the SDK: missing, the docker modules fail to import (not a skip)

from forge_env.sandbox.docker import IMAGE_ENV, image_name
from tests.trust_boundary import missing, requires

IMAGE = image_name()


def _engine_status():
    """(client, None) when a Docker engine answers and has the sandbox image, else (None, why not)."""
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        return None, (f"no Docker engine answers ({exc}); `make test` installs and starts one where it can "
                      f"(root with apt-get), or run `tools/docker_engine.sh start`")
    try:
        client.images.get(IMAGE)
    except Exception as exc:
        return None, f"the engine lacks the sandbox image {IMAGE} ({exc}); run `make docker-image` or set {IMAGE_ENV}"
    return client, None


ENGINE, ENGINE_MISSING = _engine_status()
requires_docker = requires("docker", ENGINE_MISSING and f"docker backend: {ENGINE_MISSING}")


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


#: The private dockerd's images and layers, kept between test runs: loading the image costs seconds, and
#: deleting a data root whose layers containers have used takes tens of seconds on a busy VM.
PRIVATE_DATA_ROOT = f"/var/tmp/forge-env-test-dockerd-{os.geteuid()}"


class PrivateEngine:
    """A dockerd of the test's own (socket and exec root in a temporary directory, a data root of its own,
    no-network mode) holding a copy of the sandbox image: killing it leaves the shared engine alone."""

    def __init__(self) -> None:
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            missing("docker", "a private dockerd needs the dockerd binary and root")
        self.root = tempfile.mkdtemp(prefix="fedk.", dir="/tmp")  # short: unix socket paths are capped
        self.socket = f"{self.root}/d.sock"
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None
        os.makedirs(PRIVATE_DATA_ROOT, exist_ok=True)
        self._lock = open(f"{PRIVATE_DATA_ROOT}/.lock", "w")
        try:  # another test run is using it: take a throw-away data root
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.data_root = f"{PRIVATE_DATA_ROOT}/data"
        except OSError:
            self.data_root = f"{self.root}/data"

    def start(self) -> None:
        # A killed dockerd's containerd stays a zombie for a moment, and a dockerd started then takes it for
        # a live one and hangs waiting for it.
        wait_until(self.containerd_gone, 30, "the previous containerd to exit")
        self.proc = subprocess.Popen(
            ["dockerd", "--host", self.url, "--data-root", self.data_root, "--exec-root", f"{self.root}/x",
             "--pidfile", f"{self.root}/d.pid", "--iptables=false", "--ip-forward=false", "--bridge=none"],
            stdout=open(f"{self.root}/log", "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self.answers, 60, f"the private dockerd to answer (log: {self.root}/log)")

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the private dockerd exited with {self.proc.returncode}; log: {self.root}/log")
        return subprocess.run(["docker", "-H", self.url, "version"], capture_output=True).returncode == 0

    def load_image(self) -> None:
        """Copy the sandbox image from the shared engine (unless this data root already has it)."""
        wanted = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE], capture_output=True,
                                text=True, check=True).stdout
        have = subprocess.run(["docker", "-H", self.url, "image", "inspect", "-f", "{{.Id}}", IMAGE],
                              capture_output=True, text=True).stdout
        if have and have == wanted:
            return
        save = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", self.url, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        assert save.wait() == 0

    def containerd_gone(self) -> bool:
        try:
            with open(f"{self.root}/x/containerd/containerd.pid") as f:
                pid = int(f.read())
        except (OSError, ValueError):
            return True
        return not os.path.exists(f"/proc/{pid}")  # not even a zombie

    def kill(self) -> None:
        """SIGKILL dockerd (what a crash or the OOM killer does)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """Remove every container, stop dockerd and its containerd, unmount and delete everything."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                ids = subprocess.run(["docker", "-H", self.url, "ps", "-aq"], capture_output=True, text=True).stdout
                if ids.split():
                    subprocess.run(["docker", "-H", self.url, "rm", "-f", *ids.split()], capture_output=True)
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            wait_until(self.containerd_gone, 30, "the private containerd to exit")
        finally:
            with open("/proc/mounts") as f:
                mounts = [line.split()[1] for line in f]
            for mount in sorted(mounts, reverse=True):
                if mount.startswith((self.root + "/", self.data_root)):
                    subprocess.run(["umount", "-l", mount], capture_output=True)
            shutil.rmtree(self.root, ignore_errors=True)
            self._lock.close()
