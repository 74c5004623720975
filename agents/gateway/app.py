"""The gateway's HTTP face: OpenAI's ``/v1/chat/completions`` and ``/v1/models`` over an :class:`AgentGateway`.

An episode is the URL prefix ``/e/{episode_id}/v1`` (point a harness's base URL there) or the header
``X-Episode-ID`` on ``/v1/...``. Bodies are bounded (``max_body_bytes``, read within ``body_timeout_s``),
decoded as strict UTF-8 and parsed with the serve package's guarded JSON parser (deep nesting, huge numbers);
every refusal is an OpenAI-style error body. With ``token`` set every route but ``/health`` needs
``Authorization: Bearer <token>``. Closing an episode over HTTP (``POST /admin/episodes/{id}/finish``) exists
only with a separate ``admin_token``: the harness must not be able to grade itself.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agents.gateway import wire
from agents.gateway.core import AgentGateway, GatewayError
from agents.gateway.envs import EnvEpisodeError
from forge_env.errors import InfraError
from forge_env.generation.base import PromptTooLongError
from forge_env.openenv.guards import BodyTooLargeError, parse_json, read_body

EPISODE_HEADER = "x-episode-id"
logger = logging.getLogger(__name__)


@dataclass
class GatewayServeSettings:
    """HTTP limits of the gateway. ``token``: the harness's bearer token; ``admin_token``: the trainer's."""

    token: str | None = None
    admin_token: str | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout_s: float | None = 60.0
    trajectories_path: str | None = None
    """JSONL file each trajectory finished over HTTP is appended to."""


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse(wire.error_body(message, kind, param, code), status_code=status)


def error_response(exc: BaseException) -> JSONResponse:
    """The OpenAI-style error answer for an exception raised while serving a call."""
    if isinstance(exc, GatewayError):
        return _error(exc.status, str(exc), "invalid_request_error" if exc.status < 500 else "server_error",
                      exc.param, exc.code)
    if isinstance(exc, EnvEpisodeError):
        return _error(exc.status, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, PromptTooLongError):
        return _error(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, InfraError):  # any failure of the machine (forge_env.errors)
        return _error(503, f"{type(exc).__name__}: the generator is unavailable", "server_error",
                      code="generator_unavailable")
    if isinstance(exc, ValueError):  # a renderer's refusal (strict template, a template it cannot probe)
        return _error(400, f"{type(exc).__name__}: {exc}")
    reference = uuid.uuid4().hex[:12]
    logger.error("forge-env gateway: unexpected %s (reference %s)", type(exc).__name__, reference, exc_info=exc)
    return _error(500, f"{type(exc).__name__} while serving the call (the gateway's log has the details under "
                       f"reference {reference})", "server_error", code="internal_error")


CHAT_PATH = re.compile(r"/(?:e/([^/]+)/)?v1/chat/completions")


class GatewayFront:
    """Pure ASGI middleware in front of the FastAPI app: the bearer tokens (``/health`` is open; ``/admin/`` needs
    the admin token and exists only with one), then the chat-completions route served directly (``slot.chat``),
    everything else by FastAPI. Not starlette's ``BaseHTTPMiddleware`` (a task group and memory streams per request)
    nor FastAPI's routing and dependency solving for the hot route: together ~0.3 ms a call on the development box.
    """

    class Slot:
        chat: Any = None

    def __init__(self, app: Any, settings: GatewayServeSettings, slot: GatewayFront.Slot) -> None:
        self.app, self.settings, self.slot = app, settings, slot
        self._user = _expected(settings.token)
        self._admin = _expected(settings.admin_token)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            match = CHAT_PATH.fullmatch(scope["path"])
            if match is not None:
                request = Request(scope, receive)
                if scope["method"] != "POST":
                    response = _error(405, f"{scope['method']} is not allowed on {scope['path']}",
                                      code="method_not_allowed")
                else:
                    response = await self.slot.chat(request, match.group(1) or request.headers.get(EPISODE_HEADER))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Any) -> JSONResponse | None:
        path = scope["path"]
        admin = path.startswith("/admin/")
        expected = self._admin if admin else self._user
        if admin and expected is None:
            return _error(404, "the admin routes are off (start the gateway with an admin token)", code="not_found")
        if expected is None or path == "/health":
            return None
        given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        if hmac.compare_digest(given, expected):
            return None
        return _error(401, f"missing or wrong {'admin ' if admin else ''}bearer token", "authentication_error",
                      code="invalid_api_key")


def _expected(token: str | None) -> bytes | None:
    return None if token is None else f"Bearer {token}".encode()


def build_app(gateway: AgentGateway, settings: GatewayServeSettings | None = None) -> FastAPI:
    """The FastAPI app serving ``gateway``."""
    settings = settings or GatewayServeSettings()

    # The episodes outlive the server: the training app finishes them (the CLI closes them on exit).
    app = FastAPI(title="forge-env gateway", docs_url=None, redoc_url=None, openapi_url=None)

    front = GatewayFront.Slot()
    app.add_middleware(GatewayFront, settings=settings, slot=front)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Any) -> JSONResponse:
        return _error(404, f"no route {request.method} {request.url.path}", code="not_found")

    @app.exception_handler(405)
    async def not_allowed(request: Request, exc: Any) -> JSONResponse:
        return _error(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "open_episodes": len(gateway.open_episodes), **gateway.stats}

    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": gateway.config.model_name, "object": "model", "created": 0,
                                            "owned_by": "forge-env"}]}

    app.get("/v1/models")(models)
    app.get("/e/{episode_id}/v1/models")(models)

    async def body_of(request: Request) -> Any:
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GatewayError(f"the request body is not valid UTF-8 (byte {exc.start})") from None
        try:
            return parse_json(text)
        except ValueError as exc:
            raise GatewayError(f"the request body is not valid JSON: {exc}") from None

    async def complete(request: Request, episode_id: str | None) -> Any:
        try:
            if not episode_id:
                raise GatewayError("no episode: use the base URL /e/{episode_id}/v1 or the X-Episode-ID header",
                                   param="episode_id")
            body = await body_of(request)
            call = wire.parse_request(body, gateway.config.max_tokens, gateway.config.default_sampling)
            result = await gateway.chat(episode_id, call.messages, tools=call.tools, sampling=call.sampling,
                                        tool_choice=call.tool_choice)
        except BodyTooLargeError as exc:
            return _error(413, str(exc), code="request_too_large")
        except TimeoutError:
            return _error(408, "the request body was not received in time", code="request_timeout")
        except Exception as exc:
            return error_response(exc)
        decode = _token_text(gateway.renderer.tokenizer)
        if not call.stream:
            return JSONResponse(wire.response_body(call, result, decode, episode_id),
                                headers={"X-Episode-ID": episode_id})
        chunks = wire.stream_chunks(call, result, decode, gateway.renderer.decode_assistant)

        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"X-Episode-ID": episode_id, "Cache-Control": "no-cache"})

    front.chat = complete  # the hot route, served by the front middleware without FastAPI's routing

    @app.get("/e/{episode_id}/env")
    async def env_episode(episode_id: str) -> Any:
        try:
            return gateway.envs.describe(episode_id)
        except Exception as exc:
            return error_response(exc)

    @app.post("/e/{episode_id}/env/tools/{name}")
    async def env_tool(episode_id: str, name: str, request: Request) -> Any:
        try:
            return await gateway.envs.call_tool(episode_id, name, await body_of(request))
        except BodyTooLargeError as exc:
            return _error(413, str(exc), code="request_too_large")
        except TimeoutError:
            return _error(408, "the request body was not received in time", code="request_timeout")
        except Exception as exc:
            return error_response(exc)

    @app.post("/admin/episodes")
    async def open_episode(request: Request) -> Any:
        try:
            body = await body_of(request) if await request.body() else {}
            if not isinstance(body, dict):
                raise GatewayError("the body must be a JSON object")
            return {"episode_id": gateway.open_episode(body.get("episode_id"), **(body.get("metadata") or {}))}
        except Exception as exc:
            return error_response(exc)

    @app.post("/admin/episodes/{episode_id}/finish")
    async def finish(episode_id: str, request: Request) -> Any:
        try:
            body = await body_of(request)
            if not isinstance(body, dict) or not isinstance(body.get("reward", 0.0), int | float):
                raise GatewayError("the body must be {'reward': number, 'status': ...}", param="reward")
            trajectory = await gateway.finish(episode_id, reward=float(body.get("reward", 0.0)),
                                              status=body.get("status", "ok"))
            if settings.trajectories_path:
                with open(settings.trajectories_path, "a", encoding="utf-8") as out:
                    out.write(trajectory.to_json() + "\n")
            return JSONResponse(trajectory.to_dict())
        except Exception as exc:
            return error_response(exc)

    return app


def _token_text(tokenizer: Any) -> Any:
    def decode(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)

    return decode


class GatewayServer:
    """uvicorn serving a gateway app in the running event loop (``async with``; ``base_url`` once started).

    Binds ``host`` (loopback by default; port 0 picks a free one); the serve package's header timeout closes
    connections that never finish their request headers.
    """

    def __init__(self, gateway: AgentGateway, settings: GatewayServeSettings | None = None, *,
                 host: str = "127.0.0.1", port: int = 0, header_timeout_s: float = 10.0) -> None:
        self.app = build_app(gateway, settings)
        self.host, self.port, self.header_timeout_s = host, port, header_timeout_s
        self._server: Any = None
        self._task: asyncio.Task | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def episode_url(self, episode_id: str) -> str:
        """The OpenAI base URL of one episode."""
        return f"{self.base_url}/e/{episode_id}/v1"

    async def start(self) -> GatewayServer:
        import uvicorn

        from forge_env.openenv.guards import header_timeout_protocol
        from forge_env.openenv.server import bind_listener

        listener = bind_listener(self.host, self.port)
        self.port = listener.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(
            self.app, host=self.host, port=self.port, log_level="warning", timeout_graceful_shutdown=5,
            access_log=False, proxy_headers=False, server_header=False, date_header=False,
            http=header_timeout_protocol(self.header_timeout_s)))
        self._task = asyncio.ensure_future(self._server.serve(sockets=[listener]))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises why it stopped
            raise RuntimeError("the gateway server stopped while starting")
        return self

    async def wait(self) -> None:
        """Until the server stops (Ctrl-C, SIGTERM)."""
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await asyncio.wait_for(asyncio.shield(self._task), 10)

    async def __aenter__(self) -> GatewayServer:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
