"""Sockets accepted by ``forge-env serve`` and the agent gateway (both serve uvicorn on ``bind_listener``) have
TCP_NODELAY set: without it a keep-alive response written as headers then body waits ~40 ms for the client's
delayed ACK (Nagle's algorithm)."""

import asyncio
import socket

import uvicorn

from forge_env.openenv.guards import header_timeout_protocol
from forge_env.openenv.server import bind_listener


async def test_accepted_connections_have_tcp_nodelay():
    seen: list[int] = []

    class Recording(header_timeout_protocol(10.0)):  # the protocol both servers run, reading the option back
        def connection_made(self, transport):
            sock = transport.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            super().connection_made(transport)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=Recording, lifespan="off"))
    task = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        while not server.started:
            assert not task.done(), task.result()
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        server.should_exit = True
        await task
    assert seen and all(seen), seen
