"""``forge-env serve`` against a hostile client on loopback: bad JSON, oversized bodies, silent sockets, auth.

One real server process (the local backend: the attacks are on the web layer, the replicas are covered by
test_serve.py) with a token, a small frame limit, and short header and idle timeouts.
"""

import asyncio
import json
import socket

import httpx
import pytest
import websockets

from forge_env.openenv import protocol as wire
from tests.serve_support import ServerProcess
from tests.waiting import wait_until

TOKEN = "red-team-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HEADER_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def server():
    server = ServerProcess.forge("forge_env/ToolUse-v0", "--backend", "local", "--max-sessions", "4",
                                 "--idle-ttl", "30", "--token", TOKEN, "--max-frame-mb", "0.05",
                                 "--header-timeout", str(HEADER_TIMEOUT_S))
    yield server
    assert server.stop() == 0


def ws_url(server) -> str:
    return server.url.replace("http", "ws") + "/ws"


async def exchange(ws, raw) -> dict:
    await ws.send(raw)
    return json.loads(await asyncio.wait_for(ws.recv(), 30))


async def test_hostile_frames_are_error_frames_and_the_session_survives(server):
    async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:
        hostile = {
            "[" * 5000 + "]" * 5000: wire.INVALID_JSON,  # RecursionError in json.loads
            "1" * 5000: wire.INVALID_JSON,  # over Python's int-from-string digit limit: ValueError
            b"\xff\xfe\x00garbage": wire.INVALID_JSON,  # a binary frame
            "NaN": wire.VALIDATION_ERROR,
            '{"type": "teleport"}': wire.UNKNOWN_TYPE,
            '{"type": "step", "data": {"content": "Answer: 1"}}': wire.RESET_NEEDED,
            '{"type": "reset", "data": {"seed": 1e999}}': wire.VALIDATION_ERROR,
        }
        for raw, code in hostile.items():
            reply = await exchange(ws, raw)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (raw[:20], reply)
        bad_task = {"question": "q", "answer": 1, "documents": [{"id": ["a"], "title": {"t": 1}, "text": None}]}
        reply = await exchange(ws, json.dumps({"type": "reset", "data": {"seed": 0, "options": {"task": bad_task}}}))
        assert reply["data"]["code"] == wire.VALIDATION_ERROR, reply  # a bad task, not a crash of the env
        assert (await exchange(ws, '{"type": "reset", "data": {"seed": 0}}'))["type"] == "observation"
        state = await exchange(ws, '{"type": "state"}')
        assert state["data"]["step_count"] == 0


async def test_stateless_bodies_are_bounded_and_parsed_safely(server):
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as client:
        for body in (b"[" * 5000 + b"]" * 5000, b"1" * 5000):
            reply = await client.post("/reset", content=body)
            assert reply.status_code == 422 and reply.json()["code"] == wire.INVALID_JSON

        oversized = b'{"seed": 0, "pad": "' + b"x" * 100_000 + b'"}'
        reply = await client.post("/reset", content=oversized)
        assert reply.status_code == 413

        async def chunked():  # no Content-Length: the limit must hold while streaming
            for _ in range(100):
                yield b"x" * 1000

        reply = await client.post("/step", content=chunked())
        assert reply.status_code == 413
        assert (await client.post("/reset", json={"seed": 0})).status_code == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer  {TOKEN}"},
                                     {"Authorization": TOKEN}, {"X-Token": TOKEN}])
async def test_no_token_variant_gets_in(server, headers):
    assert httpx.post(server.url + "/reset", headers=headers).status_code == 401
    assert httpx.get(server.url + f"/stats?token={TOKEN}", headers=headers).status_code == 401
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(ws_url(server) + f"?token={TOKEN}", additional_headers=headers):
            pass
    assert refused.value.response.status_code == 403


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (a non-blocking socket; replies it sent first are read and dropped)."""
    while True:
        try:
            if sock.recv(65536) == b"":
                return True
        except BlockingIOError:
            return False
        except ConnectionError:
            return True


async def test_silent_and_dripping_sockets_are_closed(server):
    host, port = server.url.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)))
    dripping = socket.create_connection((host, int(port)))
    dripping.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
    keep_alive = socket.create_connection((host, int(port)))
    keep_alive.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /health HTTP/1.1\r\n")  # stalls on #2
    for sock in (silent, dripping, keep_alive):
        sock.setblocking(False)
    try:
        async with websockets.connect(ws_url(server), additional_headers=AUTH) as ws:  # past its headers
            for sock in (silent, dripping, keep_alive):
                await wait_until(lambda sock=sock: closed_by_server(sock), timeout=60)
            reply = await exchange(ws, '{"type": "state"}')  # the WebSocket outlives the header timeout
            assert reply["type"] == "state"
    finally:
        for sock in (silent, dripping, keep_alive):
            sock.close()


def test_unexpected_errors_leave_their_text_in_the_log_not_the_frame(caplog):
    from forge_env.openenv.app import error_frame_for

    frame = error_frame_for(FileNotFoundError("[Errno 2] No such file: '/srv/secrets/tasks.jsonl'"))
    assert frame["data"]["code"] == wire.EXECUTION_ERROR
    assert "/srv/secrets" not in json.dumps(frame) and frame["data"]["reference"] in frame["data"]["message"]
    assert "/srv/secrets" in caplog.text and frame["data"]["reference"] in caplog.text


GOOD_RESET = {"type": "observation", "data": {"observation": {
    "messages": [{"role": "user", "content": "hi"}], "terminated": False, "truncated": False, "info": {}, "tools": []},
    "reward": None, "done": False}}


def step_reply(reward=0.0, **observation):
    return {"type": "observation", "data": {"observation": {"messages": [], "terminated": False, "truncated": False,
                                                            "info": {}, **observation}, "reward": reward, "done": False}}


HOSTILE_STEP_REPLIES = {
    "reward a word": step_reply(reward="lots"),
    "NaN reward": step_reply(reward=float("nan")),
    "infinite reward": step_reply(reward=float("inf")),
    "reward a bool": step_reply(reward=True),
    "messages not a list": step_reply(messages="hi"),
    "message not an object": step_reply(messages=[1]),
    "message content an object": step_reply(messages=[{"role": "user", "content": {"x": 1}}]),
    "info a list": step_reply(info=[1]),
    "terminated a string": step_reply(terminated="false"),
    "observation a list": {"type": "observation", "data": {"observation": [1], "reward": 0.0}},
    "data a list": {"type": "observation", "data": [1]},
}


@pytest.mark.parametrize("attack", HOSTILE_STEP_REPLIES)
async def test_openenv_text_env_refuses_a_hostile_servers_observations(attack):
    """A forge-shaped OpenEnv server on loopback that answers a reset well and a step with the attack."""
    from websockets.asyncio.server import serve

    from forge_env.openenv import OpenEnvError, OpenEnvTextEnv

    async def handler(ws):
        async for raw in ws:
            kind = json.loads(raw)["type"]
            if kind in ("reset", "step"):
                await ws.send(json.dumps(GOOD_RESET if kind == "reset" else HOSTILE_STEP_REPLIES[attack]))

    async with serve(handler, "127.0.0.1", 0) as hostile:
        env = OpenEnvTextEnv(f"http://127.0.0.1:{hostile.sockets[0].getsockname()[1]}", mode="forge")
        try:
            await env.areset(seed=0)
            with pytest.raises(OpenEnvError) as refused:
                await env.astep("Answer: 1")
            assert refused.value.code == wire.MALFORMED_FRAME
        finally:
            await env.aclose()


def _plain(observation):
    return {"type": "observation", "data": {"observation": observation, "reward": 0.0, "done": False}}


TOOL = {"name": "guess", "description": "guess", "input_schema": {"type": "object", "properties": {}}}
HOSTILE_TOOL_SERVER = {  # (reset reply, list_tools reply, call_tool reply), one of them hostile
    "reset observation a list": (_plain([1]), _plain({"tools": [TOOL]}), _plain({"result": "ok"})),
    "tools not a list": (_plain({"prompt": "hi"}), _plain({"tools": "guess"}), _plain({"result": "ok"})),
    "schema a string": (_plain({"prompt": "hi"}), _plain({"tools": [{**TOOL, "input_schema": "x"}]}),
                        _plain({"result": "ok"})),
    "tool result a list": (_plain({"prompt": "hi"}), _plain({"tools": [TOOL]}), _plain([1])),
}


@pytest.mark.parametrize("attack", HOSTILE_TOOL_SERVER)
async def test_openenv_text_env_in_tools_mode_refuses_malformed_frames(attack):
    """A plain (tool-call) OpenEnv server's malformed frame is a transport error, never the model's tool error."""
    from websockets.asyncio.server import serve

    from forge_env.openenv import OpenEnvError, OpenEnvTextEnv
    from forge_env.tools import format_hermes_call

    reset, listing, result = HOSTILE_TOOL_SERVER[attack]

    async def handler(ws):
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "reset":
                await ws.send(json.dumps(reset))
            elif frame["type"] == "step":
                await ws.send(json.dumps(listing if frame["data"].get("type") == "list_tools" else result))

    async with serve(handler, "127.0.0.1", 0) as hostile:
        env = OpenEnvTextEnv(f"http://127.0.0.1:{hostile.sockets[0].getsockname()[1]}", mode="tools")
        try:
            with pytest.raises(OpenEnvError) as refused:
                await env.areset(seed=0)
                await env.astep(format_hermes_call("guess", {}))
            assert refused.value.code == wire.MALFORMED_FRAME
        finally:
            await env.aclose()
