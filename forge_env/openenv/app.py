"""The ASGI app of ``forge-env serve``: OpenEnv's ``/ws`` protocol and describe endpoints over an EnvService.

Each WebSocket connection is one session holding (at most) one episode at a time, on a replica of the
:class:`~forge_env.services.EnvService`. ``POST /reset`` and ``POST /step`` are stateless: a fresh episode
per request, closed when the answer is sent. See docs/serving.md for the field names and error codes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect, WebSocketState

from forge_env.core.env import EpisodeEndedError, ResetNeededError, TaskError
from forge_env.openenv import protocol as wire
from forge_env.openenv.guards import BodyTooLargeError, parse_json, read_body
from forge_env.openenv.protocol import ProtocolError
from forge_env.services.env_server import EnvCapacityError, EpisodeNotFoundError
from forge_env.services.errors import NoHealthyReplicaError, ServiceClosedError, SessionLostError

WS_POLICY_VIOLATION = 1008
logger = logging.getLogger(__name__)


@dataclass
class ServeSettings:
    """How the app admits and keeps sessions. ``token``: required as ``Authorization: Bearer`` when set.

    ``max_body_bytes`` and ``body_timeout_s`` bound a ``POST /reset`` or ``/step`` body (413 / 408 past them).
    """

    max_sessions: int = 2048  # forge-env serve's default (server.DEFAULT_MAX_SESSIONS)
    idle_ttl_s: float | None = 600.0
    token: str | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    body_timeout_s: float | None = 60.0


def error_code_for(error: BaseException) -> str:
    """The error frame code for an exception raised while serving a frame."""
    if isinstance(error, ProtocolError):
        return error.code
    if isinstance(error, EnvCapacityError):
        return wire.CAPACITY_REACHED
    if isinstance(error, SessionLostError | EpisodeNotFoundError):
        return wire.SESSION_LOST
    if isinstance(error, ResetNeededError):
        return wire.RESET_NEEDED
    if isinstance(error, EpisodeEndedError):
        return wire.EPISODE_ENDED
    if isinstance(error, TaskError):
        return wire.VALIDATION_ERROR
    if isinstance(error, ServiceClosedError):
        return wire.SERVER_SHUTTING_DOWN
    if isinstance(error, NoHealthyReplicaError):
        return wire.SESSION_ERROR
    return wire.EXECUTION_ERROR


def error_frame_for(error: BaseException) -> dict[str, Any]:
    """The error frame for ``error``. An unexpected error (EXECUTION_ERROR) is logged here with its traceback
    and answered with its type and a reference only: its text may hold paths or other clients' data."""
    code = error_code_for(error)
    if code != wire.EXECUTION_ERROR:
        return wire.error_frame(code, f"{type(error).__name__}: {error}")
    reference = uuid.uuid4().hex[:12]
    logger.error("forge-env serve: unexpected %s (reference %s)", type(error).__name__, reference, exc_info=error)
    return wire.error_frame(code, f"{type(error).__name__} while serving the frame (the server's log has the "
                                  f"details under reference {reference})", reference=reference)


class WireSession:
    """One connection's episode: turns frames into calls on a ``RemoteEnv`` and results into frames."""

    def __init__(self, envs: Any) -> None:
        self.envs = envs
        self.remote = envs.env()
        self.episode_id: str | None = None
        self.steps = 0
        self.done = False
        self.total_reward = 0.0
        self.tools: list[dict] = []

    async def handle(self, frame: Any) -> dict[str, Any] | None:
        """The reply frame to ``frame``; ``None`` for a close frame. Never raises for a bad frame."""
        if not isinstance(frame, dict):
            return wire.error_frame(wire.VALIDATION_ERROR, "a frame must be a JSON object with a 'type'")
        kind = frame.get("type")
        try:
            if kind == "reset":
                return await self._reset(frame.get("data"))
            if kind == "step":
                return await self._step(frame.get("data"))
            if kind == "state":
                return {"type": "state", "data": self.state()}
            if kind == "close":
                return None
            if kind == "mcp":
                return {"type": "mcp", "data": self._mcp(frame.get("data"))}
            return wire.error_frame(wire.UNKNOWN_TYPE, f"Unknown message type: {kind}")
        except Exception as error:  # every failure becomes an error frame; the connection stays usable
            return error_frame_for(error)

    async def _reset(self, data: Any) -> dict[str, Any]:
        seed, options, episode_id = wire.parse_reset(data)
        messages, info = await self.remote.areset(seed=seed, options=options)
        self.episode_id = episode_id or self.remote.episode_id
        self.steps, self.done, self.total_reward = 0, False, 0.0
        self.tools = _shared_tools(info.get("tools", []))
        return {"type": "observation", "data": wire.reset_observation(messages, info)}

    async def _step(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict) and data.get("type") == "list_tools":  # OpenEnv MCP discovery, not a turn
            return {"type": "observation",
                    "data": wire.observation_data([], None, False, False, {}, tools=wire.mcp_tools(self.tools))}
        action = wire.parse_action(data)
        messages, reward, terminated, truncated, info = await self.remote.astep(action)
        self.steps += 1
        self.total_reward += reward
        self.done = terminated or truncated
        return {"type": "observation", "data": wire.observation_data(messages, reward, terminated, truncated, info)}

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.steps, "env_id": self.envs.env_id,
                "done": self.done, "total_reward": self.total_reward}

    def _mcp(self, request: Any) -> dict[str, Any]:
        request_id = request.get("id") if isinstance(request, dict) else None
        if isinstance(request, dict) and request.get("method") == "tools/list":
            tools = [{"name": t["name"], "description": t["description"], "inputSchema": t["input_schema"]}
                     for t in wire.mcp_tools(self.tools)]
            return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}}
        return {"jsonrpc": "2.0", "id": request_id,
                "error": {"code": -32601, "message": "only tools/list is served over mcp frames; call tools "
                                                     "with a step frame so they count as the agent's turn"}}

    async def close(self) -> None:
        try:
            await self.remote.aclose()
        except Exception:  # the service may be shutting down; the replica reaps the episode anyway
            pass


_TOOL_SPECS: dict[str, list[dict]] = {}
_MAX_TOOL_SPECS = 64


def _shared_tools(tools: Any) -> list[dict]:
    """One shared copy of each distinct tool list: every reset brings a fresh copy from the replica, and a
    session keeping its own would hold kilobytes per idle session (the specs are read, never changed)."""
    if not isinstance(tools, list):
        return []
    key = json.dumps(tools, sort_keys=True, default=str)
    shared = _TOOL_SPECS.get(key)
    if shared is None:
        if len(_TOOL_SPECS) >= _MAX_TOOL_SPECS:
            _TOOL_SPECS.clear()
        shared = _TOOL_SPECS[key] = list(tools)
    return shared


def build_app(envs: Any, settings: ServeSettings | None = None, *, on_shutdown: Any = None) -> FastAPI:
    """The FastAPI app serving ``envs`` (an :class:`~forge_env.services.EnvService`).

    ``on_shutdown``: an async callable run at the end of the app's lifespan (``serve`` shuts the
    EnvService down there, so SIGTERM leaves no replica processes behind).
    """
    settings = settings or ServeSettings()
    active: set[WireSession] = set()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if on_shutdown is not None:
            await on_shutdown()

    app = _ServeApp(title=f"forge-env serve {envs.env_id}", lifespan=lifespan, docs_url=None, redoc_url=None)

    def authorized(headers: Any) -> bool:
        if settings.token is None:
            return True
        given = headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {settings.token}".encode())

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Any:
        if request.url.path != "/health" and not authorized(request.headers):
            return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        metrics = envs.metrics()
        status = ("healthy" if metrics.healthy_replicas == len(envs.service.replicas)
                  else "degraded" if metrics.healthy_replicas else "unhealthy")
        return {"status": status}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        import forge_env

        spec = forge_env.spec(envs.env_id)
        return {"name": envs.env_id, "description": spec.description, "readme_content": None,
                "version": wire.PROTOCOL_VERSION, "author": None, "documentation_url": None}

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {"action": wire.ACTION_SCHEMA, "observation": wire.OBSERVATION_SCHEMA, "state": wire.STATE_SCHEMA}

    @app.get("/state")
    async def state() -> dict[str, Any]:
        return {"episode_id": None, "step_count": 0}  # HTTP is stateless; episodes live on /ws

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        replicas = [r if isinstance(r, dict) else {"error": str(r)} for r in await envs.replica_stats()]
        metrics = envs.metrics()
        return {"env_id": envs.env_id, "active_sessions": len(active), "max_sessions": settings.max_sessions,
                "sessions_lost": metrics.sessions_lost, "sessions_resumed": metrics.sessions_resumed,
                "replicas": replicas}

    @app.post("/reset")
    async def reset(request: Request) -> JSONResponse:
        return await _stateless(request, stepping=False)

    @app.post("/step")
    async def step(request: Request) -> JSONResponse:
        return await _stateless(request, stepping=True)

    async def _stateless(request: Request, *, stepping: bool) -> JSONResponse:
        """A fresh episode per request: reset (with the body's seed/options), then the action if any."""
        try:
            body = parse_json(await read_body(request, settings.max_body_bytes, settings.body_timeout_s) or b"{}")
        except BodyTooLargeError as error:
            return JSONResponse({"detail": str(error), "code": wire.VALIDATION_ERROR}, status_code=413)
        except TimeoutError:
            return JSONResponse({"detail": f"the request body did not arrive within {settings.body_timeout_s:g} s",
                                 "code": wire.VALIDATION_ERROR}, status_code=408)
        except ValueError as error:
            return JSONResponse({"detail": f"Invalid JSON: {error}", "code": wire.INVALID_JSON}, status_code=422)
        if stepping and not (isinstance(body, dict) and "action" in body):
            return JSONResponse({"detail": "POST /step needs {'action': {...}}", "code": wire.VALIDATION_ERROR},
                                status_code=422)
        session = WireSession(envs)
        try:
            reply = await session.handle({"type": "reset", "data": body})
            if stepping and reply is not None and reply["type"] == "observation":
                reply = await session.handle({"type": "step", "data": body["action"]})
        finally:
            await session.close()
        assert reply is not None
        if reply["type"] == "error":
            code = reply["data"]["code"]
            status = {wire.CAPACITY_REACHED: 503, wire.VALIDATION_ERROR: 422,
                      wire.SERVER_SHUTTING_DOWN: 503}.get(code, 500)
            return JSONResponse({"detail": reply["data"]["message"], "code": code}, status_code=status)
        return JSONResponse(reply["data"])

    async def websocket_session(websocket: WebSocket) -> None:
        if not authorized(websocket.headers):
            await websocket.close(code=WS_POLICY_VIOLATION, reason="missing or wrong bearer token")
            return
        await websocket.accept()
        if len(active) >= settings.max_sessions:
            await _send(websocket, wire.error_frame(
                wire.CAPACITY_REACHED, f"the server holds {len(active)} sessions (--max-sessions "
                f"{settings.max_sessions}); close finished sessions or retry later",
                active_sessions=len(active), max_sessions=settings.max_sessions))
            await websocket.close()
            return
        session = WireSession(envs)
        active.add(session)
        try:
            await _serve_frames(websocket, session, settings.idle_ttl_s)
        except WebSocketDisconnect:
            pass
        finally:
            active.discard(session)
            await session.close()
            if websocket.application_state != WebSocketState.DISCONNECTED:
                try:
                    await websocket.close()
                except (RuntimeError, WebSocketDisconnect):  # the client hung up first
                    pass

    app.add_api_websocket_route("/ws", websocket_session)  # listed as a route; served by the fast path below
    app.ws_session = websocket_session
    return app


class _ServeApp(FastAPI):
    """FastAPI with ``/ws`` served straight from the ASGI call, not through the middleware and routing stack.

    A session's task waits on its socket for most of its life, and every layer it was called through keeps a
    frame (and FastAPI an exit stack) alive for as long: about 5 KB per idle session, for routing that is
    a path comparison. Everything else (HTTP, the lifespan) goes through FastAPI as usual.
    """

    ws_session: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and self.ws_session is not None:
            path, root = scope["path"], scope.get("root_path", "")
            if (path[len(root):] if root and path.startswith(root) else path) == "/ws":
                await self.ws_session(WebSocket(scope, receive=receive, send=send))
                return
        await super().__call__(scope, receive, send)


async def _serve_frames(websocket: WebSocket, session: WireSession, idle_ttl_s: float | None) -> None:
    while True:
        try:
            async with asyncio.timeout(idle_ttl_s):  # one timer; wait_for would add a task per frame on 3.11
                message = await websocket.receive()
        except TimeoutError:
            await _send(websocket, wire.error_frame(
                wire.SESSION_EXPIRED, f"no frame for {idle_ttl_s:g} s (the server's idle TTL); the session is "
                "closed, connect again to start a new one"))
            return
        if message["type"] == "websocket.disconnect":
            return
        raw = message.get("text")
        if raw is None:
            raw = (message.get("bytes") or b"").decode("utf-8", "replace")
        try:
            frame = parse_json(raw)
        except ValueError as error:
            await _send(websocket, wire.error_frame(wire.INVALID_JSON, f"Invalid JSON: {error}"))
            continue
        reply = await session.handle(frame)
        if reply is None:
            return
        await _send(websocket, reply)


async def _send(websocket: WebSocket, frame: dict[str, Any]) -> None:
    await websocket.send_text(json.dumps(frame))
