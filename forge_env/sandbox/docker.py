"""The ``docker`` backend: the same fork server as PID 1 of a warm, locked-down container per worker.

Each worker is one container (``network_mode="none"``, read-only root unless ``read_only=False``, all
capabilities dropped, no-new-privileges, an unprivileged user, size-capped tmpfs for /tmp and /dev/shm)
whose main process is the fork server, spoken to over the container's attached stdin/stdout. On top of the
per-process rlimits every run gets, the container bounds the memory of all its processes together and
their number (cgroup limits, see :func:`container_limits`). Runs and sessions behave exactly as on the process backend.

The docker SDK (``pip install forge-env[docker]``) is imported only when this backend is built, and the
image must already be present: nothing is pulled implicitly (pass ``pull=True`` to allow it). The default
image, ``forge-env/python:bookworm`` (or ``$FORGE_ENV_DOCKER_IMAGE``), is built offline from Debian's
packages by ``make docker-image``; any image with Python 3.9+ at ``python`` works.

Engine failures never escape as the SDK's own exceptions: an engine that does not answer, a missing
image, or a container the engine refuses to create or start raise :class:`SandboxUnavailableError` saying
what to do; an engine that dies under a running program answers that run with a ``sandbox_error`` result.
A container whose removal fails (the engine is down) is remembered and removed once the engine answers
again; its processes are killed from the host meanwhile when the engine runs on this machine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import struct
import threading
import uuid
import weakref
from typing import Any

from forge_env.sandbox.base import SandboxLimits, SandboxUnavailableError
from forge_env.sandbox.bwrap import PYTHON_FLAGS, random_uid, sandbox_env, server_config, server_source
from forge_env.sandbox.cgroup import MemoryCgroup, clean_exit
from forge_env.sandbox.docker_engine import (
    LABEL,
    docker_module,
    engine_errors,
    engine_limits_pids,
    explain,
    layer_usage,
    local_process,
    remove_container,
    remove_containers,
    remove_exited_containers,
)
from forge_env.sandbox.pool import PooledSandbox
from forge_env.sandbox.workers import WorkerFailure

logger = logging.getLogger(__name__)

#: The image ``make docker-image`` builds (Debian bookworm's python3, nothing else); see ``image_name``.
DEFAULT_IMAGE = "forge-env/python:bookworm"
IMAGE_ENV = "FORGE_ENV_DOCKER_IMAGE"
#: What the server wipes after every run: the tmpfs, and the container's POSIX message queues (the engine
#: mounts their file system at /dev/mqueue; unlinking a file there removes the queue).
SCRATCH = ("/tmp", "/dev/shm", "/dev/mqueue")
STARTUP_TIMEOUT_S = 60.0
#: Seconds each engine call of :meth:`DockerSandbox.commit_session` may take.
COMMIT_TIMEOUT_S = 600.0
#: Memory the fork server and the engine's own accounting take in a container, beyond what runs use.
SERVER_MEMORY_MB = 128
#: Processes beyond ``max_processes`` the container may hold (the server, a session's REPL, slack).
SERVER_PROCESSES = 8
#: RLIMIT_NPROC of runs when a fixed uid is shared by containers and their pids cgroups bound them instead.
UNCOUNTED_PROCESSES = 1 << 22
_STDOUT, _STDERR = 1, 2
ENGINE_HINT = ("start one (as root: `tools/docker_engine.sh start`, or the system's docker service), point "
               "DOCKER_HOST at it, or use the process backend")


class SessionTooLargeError(Exception):
    """A session's changes are past :meth:`DockerSandbox.commit_session`'s limits: nothing was committed (what
    the code in the sandbox did, never the machine's failure)."""


def image_name() -> str:
    """The sandbox image: ``$FORGE_ENV_DOCKER_IMAGE`` when set, else :data:`DEFAULT_IMAGE`."""
    return os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def container_limits(limits: SandboxLimits) -> dict[str, Any]:
    """The cgroup limits of one worker's container: all its processes' memory together (one run at its
    own ``memory_mb``, both tmpfs full, and the server) and their number (``max_processes`` and the
    server's own). Per-process limits stay the rlimits every run gets inside."""
    return {"mem_limit": f"{limits.memory_mb + 2 * limits.workdir_size_mb + SERVER_MEMORY_MB}m",
            "pids_limit": limits.max_processes + SERVER_PROCESSES}


class DockerWorker:
    """One container running the fork server; its stdio is multiplexed on an attach socket."""

    def __init__(self, container: Any, sock: Any, pidfd: int | None = None, cgroup: MemoryCgroup | None = None) -> None:
        self._container = container
        self.container_id: str = container.id
        self._sock = sock
        self._raw = getattr(sock, "_sock", sock)
        self._buffer = bytearray()
        self._alive = True
        self._lock = threading.Lock()
        self._pidfd = pidfd
        self._cgroup = cgroup  # read only (the engine owns it): its OOM kills tell runs killed for memory
        self._oom_kills = cgroup.oom_kills() if cgroup is not None else 0
        self.stderr_tail = bytearray()

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pids(self) -> list[int]:
        """The host pid of the container's fork server when the engine is local (for CPU accounting)."""
        if self._pidfd is None:
            return []
        try:
            with open(f"/proc/self/fdinfo/{self._pidfd}") as f:
                pid = next(int(line.split()[1]) for line in f if line.startswith("Pid:"))
        except (OSError, StopIteration, ValueError):
            return []
        return [pid] if pid > 0 else []

    def _recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._raw.recv(n - len(out))
            if not chunk:
                raise WorkerFailure("the container's connection closed (it exited, or the engine went away)")
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
        reply = await asyncio.to_thread(self._exchange, message, timeout)
        if self._cgroup is not None and not clean_exit(reply):
            kills = self._cgroup.oom_kills()
            if kills > self._oom_kills and reply.get("killed_reason") == "signal:SIGKILL":
                reply["killed_reason"] = "memory"  # the kernel killed it: the container's memory was full
            self._oom_kills = kills
        return reply

    async def greeting(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._exchange, None, STARTUP_TIMEOUT_S)

    def remove(self) -> bool:
        """Remove the container; False when the engine could not (it is then still to be removed).

        Either way, a local container's processes are killed first through the pidfd: the engine may be
        gone, and a PID namespace ends with its first process."""
        self._alive = False
        try:
            self._sock.close()
        except OSError:
            pass
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except OSError:
                pass  # already exited
            os.close(self._pidfd)
            self._pidfd = None
        return remove_container(self._container.client, self.container_id)

    async def close(self) -> None:
        await asyncio.to_thread(self.remove)


class DockerSandbox(PooledSandbox):
    """Sandboxed Python in Docker containers (a warm pool of them), for hosts where that is the norm.

    Args:
        limits: resource limits for every run (the container's cgroup limits are sized from them).
        image: image with Python 3.9+ (default :func:`image_name`); it must be present unless ``pull``.
        python: interpreter inside the image.
        cpus: CPU share of each container.
        max_concurrency, max_sessions, preload, env: as for the process backend.
        client: a ``docker.DockerClient`` (default ``docker.from_env()``: ``DOCKER_HOST`` or the local socket).
        pull: pull the image if it is missing.
        runtime: the engine's OCI runtime for the containers (e.g. ``"runsc"`` for gVisor; default the engine's).
        uid: the uid code runs as inside. Default: a random one of millions per container, so that
            ``RLIMIT_NPROC`` counts each container's processes apart; rootless engines map only a small
            subordinate range (often 65,536 ids) and need one inside it, e.g. ``uid=1000``. With a fixed uid,
            each container's pids cgroup bounds its processes and ``RLIMIT_NPROC`` (which would count every
            container of that uid together) is lifted, where the engine enforces pids limits.
        read_only: mount the image's file system read-only (default). ``False`` lets code write where the
            image's permissions let ``uid`` write (a workspace the image gave it), for :meth:`commit_session`.
    """

    isolation = "docker"

    def __init__(self, limits: SandboxLimits | None = None, *, image: str | None = None, python: str = "python3",
                 cpus: float = 1.0, max_concurrency: int | None = None, max_sessions: int = 64,
                 preload: tuple[str, ...] | None = None, env: dict[str, str] | None = None,
                 client: Any = None, pull: bool = False, runtime: str | None = None,
                 uid: int | None = None, read_only: bool = True) -> None:
        super().__init__(limits, max_concurrency=max_concurrency, max_sessions=max_sessions, preload=preload)
        docker = docker_module()
        image = image or image_name()
        try:
            self.client = client or docker.from_env()
            self.client.ping()
        except engine_errors() as exc:
            where = os.environ.get("DOCKER_HOST") or "the default socket (unix:///var/run/docker.sock)"
            raise SandboxUnavailableError(f"no Docker engine answers at {where} ({explain(exc)}); {ENGINE_HINT}") from None
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            if not pull:
                raise SandboxUnavailableError(
                    f"the sandbox image {image!r} is not in the Docker engine; build it offline with `make "
                    f"docker-image` (Debian bookworm's python3; ${IMAGE_ENV} names it), pass image= an image with "
                    f"Python 3.9+ that the engine has, or pull=True to pull {image!r}") from None
            try:
                self.client.images.pull(image)
            except engine_errors() as exc:
                raise SandboxUnavailableError(f"could not pull {image!r}: {explain(exc)}") from None
        except engine_errors() as exc:
            raise SandboxUnavailableError(f"the Docker engine failed to look up {image!r}: {explain(exc)}") from None
        if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int) or uid <= 0):
            raise ValueError(f"uid must be a positive int (code never runs as root), got {uid!r}")
        self.image, self.python, self.cpus, self.runtime, self.uid = image, python, cpus, runtime, uid
        self.read_only = bool(read_only)
        # A uid given by the caller is shared by every container of it (and of other sandboxes that give it):
        # RLIMIT_NPROC counts all their processes together, so one container's code could take every process
        # the others may start. Where the engine enforces pids limits, each container's own cgroup bounds its
        # processes instead and the rlimit is lifted (see _message).
        self._cgroup_counts_processes = uid is not None and engine_limits_pids(self.client)
        self.env = dict(env or {})
        self.label = uuid.uuid4().hex
        self._containers: set[str] = set()  # created and not yet known to be removed
        self._unremoved: set[str] = set()  # discarded, but the engine could not remove them (yet)
        self._docker_finalizer = weakref.finalize(self, remove_containers, self.client, self._containers)
        remove_exited_containers(self.client)

    def _message(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        message = super()._message(*args, **kwargs)
        if self._cgroup_counts_processes:
            message["limits"] = message["limits"] | {"max_processes": UNCOUNTED_PROCESSES}
        return message

    def _create(self, kind: str) -> DockerWorker:
        docker = docker_module()
        limits = self.limits
        uid = self.uid or random_uid()
        tmpfs_size = f"size={limits.workdir_size_mb}m,nr_inodes={limits.max_files},mode=1777"
        nofile = max(1024, limits.open_files)
        try:
            container = self.client.containers.create(
                self.image,
                command=[self.python, *PYTHON_FLAGS, "-c", server_source(),
                         server_config(kind, list(SCRATCH), self.preload, None)],
                stdin_open=True,
                network_mode="none",
                # A uid of its own, so RLIMIT_NPROC inside does not count other containers' processes.
                user=f"{uid}:{uid}",
                read_only=self.read_only,
                tmpfs={"/tmp": tmpfs_size, "/dev/shm": tmpfs_size},
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                # Explicit ulimits: engines that would otherwise raise them (podman) need no CAP_SYS_RESOURCE.
                ulimits=[docker.types.Ulimit(name="nofile", soft=nofile, hard=nofile),
                         docker.types.Ulimit(name="core", soft=0, hard=0)],
                nano_cpus=int(self.cpus * 1e9),
                environment=sandbox_env("/tmp/run", self.env),
                working_dir="/tmp",
                labels={LABEL: self.label},
                **({"runtime": self.runtime} if self.runtime else {}),
                **container_limits(limits),
            )
        except docker.errors.DockerException as exc:  # (an APIError is also an OSError: this goes first)
            raise SandboxUnavailableError(f"the Docker engine refused to create a sandbox container from "
                                          f"{self.image!r}: {explain(exc)}; check the engine and the sandbox's "
                                          f"options (cpus, limits, image)") from None
        except OSError as exc:  # requests' connection errors: nobody answers on the socket
            raise SandboxUnavailableError(f"the Docker engine does not answer ({exc}); restart it (the sandbox "
                                          f"carries on once it answers), or use the process backend") from None
        self._containers.add(container.id)
        try:
            sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            container.start()
        except engine_errors() as exc:
            if remove_container(self.client, container.id):
                self._containers.discard(container.id)
            raise SandboxUnavailableError(f"the Docker engine could not start a sandbox container from "
                                          f"{self.image!r}: {explain(exc)}; is {self.python!r} an interpreter "
                                          f"in that image?") from None
        return DockerWorker(container, sock, *local_process(container))

    async def _spawn(self, kind: str) -> DockerWorker:
        if self._unremoved:  # left over from an engine outage: the engine may answer again now
            await asyncio.to_thread(self._remove_unremoved)
        worker = await asyncio.to_thread(self._create, kind)
        try:
            hello = await worker.greeting()
        except WorkerFailure as exc:
            await self._discard(worker)
            raise SandboxUnavailableError(f"the sandbox container did not start its server: {exc}") from None
        if not hello.get("ready"):
            await self._discard(worker)
            raise SandboxUnavailableError(f"the sandbox container sent an unexpected greeting: {hello!r}")
        return worker

    async def commit_session(self, session: Any, repository: str, tag: str = "latest", *,
                             max_mb: float | None = None, max_paths: int | None = None,
                             timeout: float = COMMIT_TIMEOUT_S) -> str:
        """Commit the file system of ``session``'s container (what its code wrote outside the tmpfs mounts) as
        the image ``repository:tag``, with the container paused so the image is one instant of it; returns
        the image id. The image keeps no process, and the container stays paused (close the session).

        A commit copies every byte of the container's writable layer (a sparse file in full) and writes a
        tar header per path, so code that wrote gigabytes or millions of files would make it fill the disk
        or outlast any deadline. With ``max_mb`` / ``max_paths`` the paused container is measured first
        (apparent bytes and paths of its layer, see :func:`layer_usage`) and :class:`SessionTooLargeError`
        raised past either, with nothing committed. ``timeout``: seconds each engine call may take (the
        client's default, 60 s, is too short for a large commit on a busy engine).
        SandboxUnavailableError when the session has no container of this sandbox or the engine refuses."""
        worker = getattr(session, "_worker", None)
        if getattr(session, "_sandbox", None) is not self or not isinstance(worker, DockerWorker):
            raise SandboxUnavailableError("commit_session needs a started session of this docker sandbox")
        api = worker._container.client.api

        def commit() -> str:
            try:
                if max_mb is not None or max_paths is not None:
                    api.pause(worker.container_id)
                    limit_bytes = float("inf") if max_mb is None else max_mb * (1 << 20)
                    limit_paths = max_paths if max_paths is not None else 1 << 62
                    try:
                        size, paths = layer_usage(api, worker.container_id, limit_bytes, limit_paths, timeout)
                    except ValueError as exc:
                        raise SessionTooLargeError(f"the changes cannot be measured: {exc}; not committed") from None
                    if size > limit_bytes:
                        raise SessionTooLargeError(f"{size / (1 << 20):.0f}+ MB of changes (apparent size), over "
                                                   f"the {max_mb:g} MB storage limit: not committed")
                    if paths > limit_paths:
                        raise SessionTooLargeError(f"{paths}+ changed paths, over the storage limit of "
                                                   f"{max_paths} paths: not committed")
                params = {"container": worker.container_id, "repo": repository, "tag": tag, "pause": True}
                response = api._post_json(api._url("/commit"), data=None, params=params, timeout=timeout)
                return api._result(response, json=True)["Id"]
            except engine_errors() as exc:
                raise SandboxUnavailableError(f"the Docker engine could not commit the session's container "
                                              f"{worker.container_id[:12]}: {explain(exc)}") from None
        return await asyncio.to_thread(commit)

    def _remove_unremoved(self) -> None:
        for container_id in list(self._unremoved):
            if remove_container(self.client, container_id):
                self._unremoved.discard(container_id)
                self._containers.discard(container_id)

    async def _discard(self, worker: DockerWorker) -> None:  # type: ignore[override]
        self._live_pids.difference_update(worker.pids)
        if await asyncio.to_thread(worker.remove):
            self._containers.discard(worker.container_id)
        else:
            self._unremoved.add(worker.container_id)

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(remove_containers, self.client, self._containers)
        self._unremoved.intersection_update(self._containers)
        if self._containers:
            logger.warning("%d sandbox container(s) could not be removed (the Docker engine does not answer); "
                           "their processes were killed, and `docker rm -f $(docker ps -aq --filter label=%s=%s)` "
                           "removes them once it answers", len(self._containers), LABEL, self.label)
