"""Replicas as real Monarch process meshes.

Every replica is its own ``ProcMesh`` (``procs`` processes on this host) with one actor
mesh on it. Meshes are spawned by a small owner actor living in this process
(:class:`MeshOwner`): Monarch reports the failure of a mesh to its owner's
``__supervise__``, and an owner that handles it keeps the failure from reaching the
root client, whose default reaction is to exit the whole program. The owner forwards
each failure to the service that holds the replica.

Replicas run on this host, or on a host of a group handed out by a Monarch job
(:mod:`forge_env.services.placement`). Monarch learns that a replica process was killed
only after several seconds (and of a host that vanished, not at all within a call), so
the processes of a replica on this machine are watched with a pidfd — the service hears
of a death in well under a millisecond — and replicas this machine cannot watch (on
another host) are pinged: one that does not answer a heartbeat in time is dead.

**Exit.** Monarch shuts its client down at interpreter exit with a 1 s budget; on a loaded machine that runs
out (seen: ``TimeoutError`` in its exit hook, exit status 1; reported: ``FATAL: exception not rethrown``,
SIGABRT, from Monarch's threads still calling into an interpreter being finalized, after a replica was lost).
The first mesh owner therefore registers :func:`shut_down_at_exit`, which runs before Monarch's own hook:
it stops forwarding failures to the services (their event loops are gone) and shuts the client down with
time to finish, so the program exits with its own status however its services ended.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import Actor, ActorError, concurrent_endpoint, current_rank, this_host, this_proc

from forge_env.services.direct_channel import DirectChannel
from forge_env.services.options import ServiceOptions
from forge_env.services.placement import GpuAllocator, host_gpus, machine_id
from forge_env.services.placement import (
    reserve_gpus as reserve_gpus,  # old import path; use forge_env.services
)
from forge_env.services.replica import ReplicaDown

logger = logging.getLogger(__name__)

# mesh name (lower case, as Monarch reports it) -> callback(reason); called from Monarch's thread
_failure_listeners: dict[str, Callable[[str], None]] = {}
_listeners_lock = threading.Lock()
_owner: Any = None
_owner_lock = threading.Lock()
_exiting = False
_exit_hook_registered = False

#: At exit: how long each of Monarch's host shutdown steps may take, and the whole client shutdown.
EXIT_HOST_TIMEOUT_S = 1.0
EXIT_TIMEOUT_S = 30.0


def shut_down_at_exit() -> None:
    """Interpreter exit (registered after Monarch's own hook, so it runs first): forward no more failures
    and shut Monarch's client down with time to finish (its own hook then finds it done). Best effort: a
    failure is logged, never raised, so it cannot change the program's exit status."""
    global _exiting
    _exiting = True
    with _listeners_lock:
        _failure_listeners.clear()
    try:
        from monarch.actor import shutdown_context

        shutdown_context(host_timeout=EXIT_HOST_TIMEOUT_S).get(timeout=EXIT_TIMEOUT_S)
    except BaseException as error:  # noqa: BLE001 - an exit hook must not fail the exit
        logger.debug("forge_env.services: shutting Monarch down at exit: %r", error)


def _register_exit_hook() -> None:
    """Once, after this process's Monarch client exists (its exit hook registered): ours runs before it."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        _exit_hook_registered = True
        atexit.register(shut_down_at_exit)


def _apply_process_env(env: dict[str, str], gpu_ids: list[str] | None) -> None:
    """Bootstrap of each replica process: environment variables, and its GPU if it has one."""
    os.environ.update(env)
    if gpu_ids is not None:
        rank = current_rank().rank
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_ids[rank] if rank < len(gpu_ids) else ""


class MeshOwner(Actor):
    """Owns the replicas' process meshes so their failures come here, not to the root client."""

    def __init__(self, host_key: str | None = None) -> None:
        self.host_key = host_key  # None: spawn on this host
        self.meshes: dict[str, Any] = {}

    @concurrent_endpoint
    async def spawn_mesh(self, name: str, actor_class: type, args: tuple, kwargs: dict,
                         per_host: dict[str, int], env: dict[str, str], gpu_ids: list[str] | None) -> Any:
        bootstrap = functools.partial(_apply_process_env, env, gpu_ids)
        host_mesh = this_host() if self.host_key is None else _host_mesh(self.host_key)
        procs = host_mesh.spawn_procs(per_host=per_host, name=name, bootstrap=bootstrap)
        self.meshes[name] = procs
        return procs.spawn(name, actor_class, *args, **kwargs)

    @concurrent_endpoint
    async def stop_mesh(self, name: str) -> None:
        procs = self.meshes.pop(name, None)
        if procs is not None:
            await procs.stop()

    def __supervise__(self, failure: Any) -> bool:
        if _exiting:  # the services' loops are gone; a failure now is the exit's own doing
            return True
        name = str(failure.mesh_name).lower()
        with _listeners_lock:
            listener = _failure_listeners.get(name.rsplit("-", 1)[0]) or _failure_listeners.get(name)
        if listener is not None:
            listener(failure.report())
        else:  # the logger mesh of a replica's procs, or a replica already stopped
            logger.debug("forge_env.services: mesh failure not attributed to a live replica: %s", name)
        return True


# owner key -> the single-host mesh that owner spawns on (owners live in this process)
_owner_hosts: dict[str, Any] = {}
_host_owners: dict[int, Any] = {}  # id(host mesh) -> its owner
_owner_count = 0


def _host_mesh(key: str) -> Any:
    return _owner_hosts[key]


def get_owner(host_mesh: Any = None) -> Any:
    """The mesh owner actor for ``host_mesh`` (``None``: this host), spawned in this process on first use.

    Each host has an owner of its own: a spawn on a host that vanished never returns, and an
    owner waiting on one would hold up every later spawn it is asked for.
    """
    global _owner, _owner_count
    with _owner_lock:
        if host_mesh is None:
            if _owner is None:
                _owner = this_proc().spawn("forge_env_mesh_owner", MeshOwner)
                _register_exit_hook()
            return _owner
        owner = _host_owners.get(id(host_mesh))
        if owner is None:
            _owner_count += 1
            key = f"host_{_owner_count}"
            _owner_hosts[key] = host_mesh
            owner = this_proc().spawn(f"forge_env_mesh_owner_{key}", MeshOwner, key)
            _register_exit_hook()
            _host_owners[id(host_mesh)] = owner
        return owner


class MonarchReplica:
    """One replica: a process mesh with one actor per process. Calls go to all ranks; rank 0 answers."""

    def __init__(self, name: str, mesh: Any, procs: int, gpu_ids: list[str] | None,
                 options: ServiceOptions | None = None, owner: Any = None,
                 gpu_allocator: GpuAllocator | None = None) -> None:
        self.name = name
        self.mesh = mesh
        self.procs = procs
        self.gpu_ids = gpu_ids
        self.options = options or ServiceOptions()
        self.owner = owner if owner is not None else get_owner()
        self.gpu_allocator = gpu_allocator or host_gpus()
        self.pids: list[int] = []
        self.machines: list[str] = []
        self._pidfds: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._stopped = False
        self.in_flight = 0
        self.monarch_messages = 0  # Monarch calls sent (a batch of calls is one)
        self.last_answer = time.monotonic()
        #: concurrent endpoints whose calls in one event-loop turn travel as one message (see ``call``)
        self.batched: frozenset[str] = frozenset()
        #: concurrent endpoints called over ``channel``, this replica's socket beside Monarch (``direct_calls``)
        self.direct: frozenset[str] = frozenset()
        self.channel: DirectChannel | None = None
        self._gathering: dict[str, list[tuple[tuple, dict, asyncio.Future[Any]]]] = {}
        self._senders: set[asyncio.Task[None]] = set()

    @property
    def local(self) -> bool:
        """Every process of this replica runs on this machine (so its pids can be watched here)."""
        return bool(self.machines) and all(m == machine_id() for m in self.machines)

    @property
    def messages(self) -> int:
        """Messages sent to the replica, over Monarch and over its direct channel (a batch of calls is one)."""
        return self.monarch_messages + (self.channel.messages if self.channel is not None else 0)

    async def call(self, endpoint: str, args: tuple, kwargs: dict) -> Any:
        """Call ``endpoint``; an application error is re-raised as itself, a dead replica as ``ReplicaDown``.

        Calls of a batched endpoint made in the same event-loop turn while others are pending (128 sessions
        stepping at once) go to the replica as one message and come back as one: a Monarch round trip costs
        far more than the call's own work for a cheap environment. Each call keeps its own result or exception;
        a call made while nothing else is pending goes at once, in the caller's task. Direct endpoints go over
        the replica's socket (``direct_calls``), batched the same way.
        """
        channel = self.channel
        if channel is not None and endpoint in self.direct:
            self.in_flight += 1
            try:
                result = await channel.call(endpoint, args, kwargs, batch=endpoint in self.batched)
            except ReplicaDown:
                raise
            except Exception:
                self._answered()
                raise
            finally:
                self.in_flight -= 1
            self._answered()
            return result
        if endpoint in self.batched and (self.in_flight or endpoint in self._gathering):
            return await self._call_batched(endpoint, args, kwargs)
        port = getattr(self.mesh, endpoint)
        self.monarch_messages += 1
        self.in_flight += 1
        try:
            if self.procs == 1:
                result = await port.call_one(*args, **kwargs)
            else:
                result = (await port.call(*args, **kwargs)).get(0)
            self._answered()
            return result
        except ActorError as error:
            self._answered()
            raise error.exception from error
        except SupervisionError as error:
            raise ReplicaDown(str(error)) from error
        finally:
            self.in_flight -= 1

    async def _call_batched(self, endpoint: str, args: tuple, kwargs: dict) -> Any:
        loop = asyncio.get_running_loop()
        gathering = self._gathering.get(endpoint)
        if gathering is None:
            gathering = self._gathering[endpoint] = []
            loop.call_soon(self._send_gathered, endpoint)  # after the calls due in this turn joined
        future: asyncio.Future[Any] = loop.create_future()
        gathering.append((args, kwargs, future))
        self.in_flight += 1
        try:
            return await future
        finally:
            self.in_flight -= 1

    def _send_gathered(self, endpoint: str) -> None:
        calls = [call for call in self._gathering.pop(endpoint, []) if not call[2].done()]  # drop cancelled ones
        if calls:
            sender = asyncio.get_running_loop().create_task(self._send(endpoint, calls))
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)

    async def _send(self, endpoint: str, calls: list[tuple[tuple, dict, asyncio.Future[Any]]]) -> None:
        self.monarch_messages += 1
        try:
            if len(calls) == 1:
                args, kwargs, _ = calls[0]
                answers = [(True, await getattr(self.mesh, endpoint).call_one(*args, **kwargs))]
            else:
                answers = await self.mesh._forge_batch.call_one(endpoint, [(a, k) for a, k, _ in calls])
            self._answered()
        except ActorError as error:
            self._answered()
            answers = [(False, error.exception)] * len(calls)
        except SupervisionError as error:
            answers = [(False, ReplicaDown(str(error)))] * len(calls)
        except BaseException as error:  # e.g. cancelled at shutdown: no caller may wait forever
            for _, _, future in calls:
                if not future.done():
                    future.set_exception(ReplicaDown(f"the call was not answered: {type(error).__name__}"))
            raise
        for (_, _, future), (ok, value) in zip(calls, answers, strict=True):
            if not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def _answered(self) -> None:
        self.last_answer = time.monotonic()

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call ``on_death`` (on the running loop) as soon as any process of this replica exits or Monarch reports it failed."""
        loop = asyncio.get_running_loop()
        self._loop = loop

        def from_monarch(report: str) -> None:
            try:  # the loop may close between the check and the call (a program ending as a report arrives)
                if not loop.is_closed():
                    loop.call_soon_threadsafe(on_death, f"Monarch reported a failure: {report}")
            except RuntimeError:
                pass

        with _listeners_lock:
            _failure_listeners[self.name.lower()] = from_monarch
        heartbeat = self.options.heartbeat
        if heartbeat == "always" or (heartbeat == "remote" and not self.local):
            self._heartbeat = loop.create_task(self._beat(on_death))
        if not self.local:
            return  # a pid on another machine means nothing here
        for pid in self.pids:
            try:
                fd = os.pidfd_open(pid)
            except (OSError, AttributeError):  # no pidfd (old kernel): Monarch's report still arrives
                continue
            self._pidfds.append(fd)
            loop.add_reader(fd, functools.partial(self._process_exited, pid, on_death))

    async def _beat(self, on_death: Callable[[str], None]) -> None:
        options = self.options
        interval, timeout = options.heartbeat_interval_s, options.heartbeat_timeout_s
        while not self._stopped:
            await asyncio.sleep(interval)
            try:
                await asyncio.wait_for(self.mesh._forge_where.call(), timeout)
                self._answered()
                continue
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                # An actor whose endpoint blocks its event loop (a train step, a model load) cannot answer
                # while it works: a busy replica gets heartbeat_busy_timeout_s since it last answered.
                silent = time.monotonic() - self.last_answer
                if self.in_flight and silent < options.heartbeat_busy_timeout_s:
                    continue
                reason = (f"no answer to a heartbeat within {timeout:g} s (host down or unreachable?)"
                          if not self.in_flight else
                          f"busy and silent for {silent:.0f} s (heartbeat_busy_timeout_s="
                          f"{options.heartbeat_busy_timeout_s:g}; host down or unreachable?)")
            except Exception as error:
                reason = f"heartbeat failed: {error}"
            if not self._stopped:
                self._close_watch()
                on_death(reason)
            return

    def _process_exited(self, pid: int, on_death: Callable[[str], None]) -> None:
        self._close_watch()
        if not self._stopped:
            on_death(f"process {pid} exited")

    def _close_watch(self) -> None:
        if self._heartbeat is not None and self._heartbeat is not asyncio.current_task():
            self._heartbeat.cancel()
        self._heartbeat = None
        for fd in self._pidfds:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(fd)
            os.close(fd)
        self._pidfds = []

    async def stop(self) -> None:
        """Stop the replica's processes (best effort: a dead replica has nothing left to stop)."""
        if self._stopped:
            return
        self._stopped = True
        self._close_watch()
        if self.channel is not None:
            self.channel.close()
        with _listeners_lock:
            _failure_listeners.pop(self.name.lower(), None)
        if self.gpu_ids:
            self.gpu_allocator.give_back(self.gpu_ids)
        try:
            # a mesh on a host that vanished never answers: give up after a while, it is gone anyway
            await asyncio.wait_for(self.owner.stop_mesh.call_one(self.name), self.options.spawn_timeout_s)
        except Exception as error:  # the mesh may already be gone with its processes
            logger.debug("forge_env.services: stopping %s: %s", self.name, error)
