"""``forge-env serve``: launch an EnvService for one environment and serve it with uvicorn.

    forge-env serve forge_env/ToolUse-v0 --replicas 2 --port 8000

The replicas start before the port opens; the line ``forge-env serve: <env> on http://HOST:PORT`` on
stdout says the server is ready (with ``--port 0``, it names the port chosen). SIGTERM or Ctrl-C stops
accepting, closes open sessions, and shuts the replicas down before the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import resource
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

TOKEN_ENV_VAR = "FORGE_ENV_SERVE_TOKEN"
#: The default ``--max-sessions``. An idle session costs the server tree tens of KB (the connection, its
#: ``RemoteEnv`` and the replica's episode; see docs/serving.md), so 2,048 sessions are a few hundred MB at most.
#: An episode that snapshots also keeps a copy of its conversation in the server process (what resumes it when
#: its replica dies), so long conversations cost that much again.
DEFAULT_MAX_SESSIONS = 2048
#: File descriptors the server keeps for itself beyond one per session (listener, Monarch, logs, replicas' pipes).
SPARE_FILES = 64


@dataclass
class ServeConfig:
    """Everything ``forge-env serve`` takes. ``max_frame_bytes`` bounds one incoming WebSocket frame and one
    ``POST`` body; ``header_timeout_s`` is how long a connection may take to send its request headers."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    max_sessions: int = DEFAULT_MAX_SESSIONS
    ws_per_message_deflate: bool = False
    idle_ttl_s: float | None = 600.0
    max_frame_bytes: int = 64 * 1024 * 1024
    token: str | None = None
    backend: str = "monarch"
    header_timeout_s: float = 10.0
    resume_sessions: bool = True

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.max_sessions < 1:
            raise ValueError(f"--replicas and --max-sessions must be at least 1, got {self.replicas} and "
                             f"{self.max_sessions}")
        if self.header_timeout_s <= 0:
            raise ValueError(f"--header-timeout must be positive, got {self.header_timeout_s}")
        if self.max_frame_bytes < 1024:
            raise ValueError(f"--max-frame-mb is too small ({self.max_frame_bytes} bytes); use at least 0.001")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def run_server(config: ServeConfig, *, announce: Any = print) -> None:
    """Serve until the process is asked to stop (SIGTERM/SIGINT); the EnvService is shut down on the way out."""
    import uvicorn

    from forge_env.openenv.app import ServeSettings, build_app
    from forge_env.openenv.guards import header_timeout_protocol
    from forge_env.services import EnvService

    files = raise_open_file_limit()
    if files < config.max_sessions + SPARE_FILES:
        print(f"forge-env serve: warning: the open-file limit is {files} (hard limit), too low for "
              f"--max-sessions {config.max_sessions}; connections past about {files - SPARE_FILES} will fail "
              f"(raise it with ulimit -Hn)", file=sys.stderr, flush=True)
    listener = bind_listener(config.host, config.port)  # a taken port fails here, before replicas are spawned
    per_replica = math.ceil(config.max_sessions / config.replicas)
    # The replicas' own reaper is a backstop for sessions the app failed to close; the app's TTL acts first.
    episode_ttl = None if config.idle_ttl_s is None else config.idle_ttl_s * 2 + 60
    try:
        envs = await EnvService.launch(config.env_id, num_replicas=config.replicas,
                                       max_episodes_per_replica=per_replica, episode_idle_ttl_s=episode_ttl,
                                       env_kwargs=config.env_kwargs, backend=config.backend,
                                       resume_sessions=config.resume_sessions)
    except BaseException:
        listener.close()
        raise
    settings = ServeSettings(max_sessions=config.max_sessions, idle_ttl_s=config.idle_ttl_s, token=config.token,
                             max_body_bytes=config.max_frame_bytes)
    app = build_app(envs, settings, on_shutdown=envs.shutdown)
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.host, port=config.port, ws_max_size=config.max_frame_bytes, log_level="warning",
        http=header_timeout_protocol(config.header_timeout_s), ws_per_message_deflate=config.ws_per_message_deflate,
        backlog=max(2048, config.max_sessions),
        timeout_graceful_shutdown=5, ws_ping_interval=20.0, ws_ping_timeout=60.0))
    _stop_on_sigterm_until(server)
    task = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            port = listener.getsockname()[1]
            announce(f"forge-env serve: {config.env_id} on http://{config.host}:{port} ({config.replicas} "
                     f"replica(s), up to {config.max_sessions} sessions, open-file limit {files})", flush=True)
        await task
    finally:
        if not task.done():
            task.cancel()
        await envs.shutdown()  # idempotent; the lifespan already did it on a clean exit


def raise_open_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit and return the soft limit now in force.

    Each WebSocket session is a socket; with the common soft limit of 1,024 the server fails to accept near
    1,000 sessions while the hard limit allows far more. The replicas, spawned after, inherit the raised limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)  # Linux's default nr_open
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # e.g. a hard limit above the kernel's nr_open: keep the soft one
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not listening yet: connections are refused until the app is up).

    Made with the protocol ``getaddrinfo`` names (TCP), not 0: asyncio sets TCP_NODELAY only on accepted sockets
    whose protocol is ``IPPROTO_TCP``, and they inherit the listener's. Without it every keep-alive HTTP response
    written in two parts (headers, body) waits for the client's delayed ACK, ~40 ms (tests/test_serve_nodelay.py).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
    except OSError as error:
        raise OSError(f"cannot bind {host}:{port}: {error.strerror or error}") from error
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as error:
        listener.close()
        raise OSError(f"cannot bind {host}:{port}: {error.strerror or error}; pick another --port (0: any free one)"
                      ) from error
    return listener


def _stop_on_sigterm_until(server: Any) -> None:
    """SIGTERM before uvicorn takes the signals over stops like Ctrl-C; after, uvicorn re-raises the signal it
    handled once it is done, which must then not kill the process before the replicas are shut down."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        if not server.should_exit:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help="a registered environment id, e.g. forge_env/ToolUse-v0")
    parser.add_argument("--kwargs", default="{}", help="JSON object of constructor arguments")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: loopback only; anything else should set a token)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: pick a free one and print it)")
    parser.add_argument("--replicas", type=int, default=1, help="EnvServer replicas (processes) holding episodes")
    parser.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS,
                        help=f"concurrent WebSocket sessions (default {DEFAULT_MAX_SESSIONS})")
    parser.add_argument("--idle-ttl", type=float, default=600.0,
                        help="seconds a session may stay silent before it is closed (0: never)")
    parser.add_argument("--max-frame-mb", type=float, default=64.0,
                        help="largest incoming WebSocket frame or POST body, MiB")
    parser.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a connection may take to send its request headers before it is closed")
    parser.add_argument("--token", default=None,
                        help=f"require 'Authorization: Bearer TOKEN' (default: ${TOKEN_ENV_VAR} if set)")
    parser.add_argument("--ws-deflate", action="store_true",
                        help="offer permessage-deflate compression (off by default: it keeps a zlib compressor and "
                             "decompressor, tens of KB, per connection; frames here are small)")
    parser.add_argument("--backend", default="monarch", choices=["monarch", "local"],
                        help="replicas as Monarch processes (default) or in this process (debugging)")
    parser.add_argument("--no-resume", action="store_true",
                        help="lose a session whose replica dies (SESSION_LOST) instead of resuming it on another "
                             "replica from its last turn's snapshot (environments that snapshot; see docs/services.md)")


def serve_command(args: argparse.Namespace) -> int:
    kwargs = json.loads(args.kwargs)
    if not isinstance(kwargs, dict):
        raise ValueError(f"--kwargs must be a JSON object, got {args.kwargs!r}")
    config = ServeConfig(env_id=args.env_id, env_kwargs=kwargs, host=args.host, port=args.port,
                         replicas=args.replicas, max_sessions=args.max_sessions,
                         idle_ttl_s=args.idle_ttl or None, max_frame_bytes=int(args.max_frame_mb * 1024 * 1024),
                         token=args.token or os.environ.get(TOKEN_ENV_VAR) or None, backend=args.backend,
                         header_timeout_s=args.header_timeout, ws_per_message_deflate=args.ws_deflate,
                         resume_sessions=not args.no_resume)
    if not is_loopback(config.host) and config.token is None:
        print(f"forge-env serve: warning: binding {config.host} without a token; anyone who can reach this port "
              f"can run episodes (set --token or ${TOKEN_ENV_VAR})", file=sys.stderr, flush=True)
    asyncio.run(run_server(config))
    return 0
