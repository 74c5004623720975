"""The ``docker`` backend: the same fork server as PID 1 of a warm, locked-down container per worker.

Each worker is one container (``network_mode="none"``, read-only root, all capabilities dropped,
no-new-privileges, an unprivileged user, memory/CPU/pids limits, size-capped tmpfs for /tmp and /dev/shm)
whose main process is the fork server, spoken to over the container's attached stdin/stdout. Runs and
sessions behave exactly as on the process backend. The docker SDK (``pip install forge-env[docker]``)
is imported only when this backend is built, and the image must already be present: nothing is pulled
implicitly (pass ``pull=True`` to allow it). The image needs Python 3.9+ at ``python``.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import uuid
import weakref
from typing import Any

from forge_env.sandbox.base import SandboxLimits, SandboxUnavailableError
from forge_env.sandbox.bwrap import PYTHON_FLAGS, random_uid, sandbox_env, server_config, server_source
from forge_env.sandbox.pool import PooledSandbox, WorkerFailure

DEFAULT_IMAGE = "python:3.11-slim"
LABEL = "forge_env.sandbox"
STARTUP_TIMEOUT_S = 60.0
_STDOUT, _STDERR = 1, 2


def _docker_module() -> Any:
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailableError("the docker backend needs the docker SDK: pip install 'forge-env[docker]'") from exc
    return docker


class DockerWorker:
    """One container running the fork server; its stdio is multiplexed on an attach socket."""

    def __init__(self, container: Any, sock: Any) -> None:
        self._container = container
        self._sock = sock
        self._raw = getattr(sock, "_sock", sock)
        self._buffer = bytearray()
        self._alive = True
        self._lock = threading.Lock()
        self.stderr_tail = bytearray()

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pids(self) -> list[int]:
        return []  # not our processes: containers are removed through the engine (see DockerSandbox)

    def _recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._raw.recv(n - len(out))
            if not chunk:
                raise WorkerFailure("the container's connection closed (it exited)")
            out += chunk
        return bytes(out)

    def _stdout_bytes(self, n: int) -> bytes:
        """``n`` bytes of the container's stdout, demultiplexing the attach stream (stderr is kept aside)."""
        while len(self._buffer) < n:
            stream, size = struct.unpack(">BxxxL", self._recv_exact(8))
            data = self._recv_exact(size)
            if stream == _STDOUT:
                self._buffer += data
            else:
                self.stderr_tail = (self.stderr_tail + data)[-4096:]
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def _exchange(self, message: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        with self._lock:
            try:
                self._raw.settimeout(timeout)
                if message is not None:
                    data = json.dumps(message).encode()
                    self._raw.sendall(struct.pack(">I", len(data)) + data)
                (size,) = struct.unpack(">I", self._stdout_bytes(4))
                return json.loads(self._stdout_bytes(size))
            except (OSError, ValueError, WorkerFailure) as exc:
                self._alive = False
                tail = self.stderr_tail.decode("utf-8", errors="replace")[-1000:]
                raise WorkerFailure(f"container worker failed: {exc}; stderr: {tail!r}") from exc

    async def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self._alive:
            raise WorkerFailure("the container worker is gone")
        return await asyncio.to_thread(self._exchange, message, timeout)

    async def greeting(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._exchange, None, STARTUP_TIMEOUT_S)

    def remove(self) -> None:
        self._alive = False
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self._container.remove(force=True)
        except Exception:  # already gone, or the engine went away: nothing left to clean
            pass

    async def close(self) -> None:
        await asyncio.to_thread(self.remove)


def _remove_containers(client: Any, ids: set[str]) -> None:
    for container_id in list(ids):
        try:
            client.containers.get(container_id).remove(force=True)
        except Exception:
            pass
    ids.clear()


class DockerSandbox(PooledSandbox):
    """Sandboxed Python in Docker containers (a warm pool of them), for hosts where that is the norm.

    Args:
        limits: resource limits for every run (the container's memory is sized from them).
        image: image with Python 3.9+ (default ``python:3.11-slim``); it must be present unless ``pull``.
        python: interpreter inside the image.
        cpus: CPU share of each container.
        max_concurrency, max_sessions, preload, env: as for the process backend.
        client: a ``docker.DockerClient`` (default ``docker.from_env()``).
        pull: pull the image if it is missing.
    """

    isolation = "docker"

    def __init__(self, limits: SandboxLimits | None = None, *, image: str = DEFAULT_IMAGE, python: str = "python3",
                 cpus: float = 1.0, max_concurrency: int | None = None, max_sessions: int = 64,
                 preload: tuple[str, ...] | None = None, env: dict[str, str] | None = None,
                 client: Any = None, pull: bool = False) -> None:
        super().__init__(limits, max_concurrency=max_concurrency, max_sessions=max_sessions, preload=preload)
        docker = _docker_module()
        try:
            self.client = client or docker.from_env()
            self.client.ping()
        except Exception as exc:
            raise SandboxUnavailableError(f"no Docker engine answers ({exc}); start one or use the process backend") from exc
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            if not pull:
                raise SandboxUnavailableError(f"docker image {image!r} is not present; `docker pull {image}` "
                                              f"first or pass pull=True") from None
            self.client.images.pull(image)
        self.image, self.python, self.cpus = image, python, cpus
        self.env = dict(env or {})
        self.label = uuid.uuid4().hex
        self._containers: set[str] = set()
        self._docker_finalizer = weakref.finalize(self, _remove_containers, self.client, self._containers)

    def _create(self, kind: str) -> DockerWorker:
        limits = self.limits
        uid = random_uid()
        tmpfs_size = f"size={limits.workdir_size_mb}m,mode=1777"
        container = self.client.containers.create(
            self.image,
            command=[self.python, *PYTHON_FLAGS, "-c", server_source(),
                     server_config(kind, ["/tmp", "/dev/shm"], self.preload, None)],
            stdin_open=True,
            network_mode="none",
            # A uid of its own, so RLIMIT_NPROC inside does not count other containers' processes.
            user=f"{uid}:{uid}",
            read_only=True,
            tmpfs={"/tmp": tmpfs_size, "/dev/shm": tmpfs_size},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=limits.max_processes + 8,
            mem_limit=f"{limits.memory_mb + 2 * limits.workdir_size_mb + 128}m",
            nano_cpus=int(self.cpus * 1e9),
            environment=sandbox_env("/tmp/run", self.env),
            working_dir="/tmp",
            labels={LABEL: self.label},
        )
        self._containers.add(container.id)
        sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        container.start()
        return DockerWorker(container, sock)

    async def _spawn(self, kind: str) -> DockerWorker:
        worker = await asyncio.to_thread(self._create, kind)
        try:
            hello = await worker.greeting()
        except WorkerFailure as exc:
            await worker.close()
            raise SandboxUnavailableError(f"the sandbox container did not start: {exc}") from None
        if not hello.get("ready"):
            await worker.close()
            raise SandboxUnavailableError(f"the sandbox container sent an unexpected greeting: {hello!r}")
        return worker

    async def _discard(self, worker: DockerWorker) -> None:  # type: ignore[override]
        await super()._discard(worker)
        self._containers.discard(worker._container.id)

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(_remove_containers, self.client, self._containers)
