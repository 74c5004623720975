"""A hostile OpenAI-compatible endpoint on 127.0.0.1, for red-team tests of the endpoint generators.

Every request gets the answer of the current ``behave(...)`` script: a status, a body (bytes, or a JSON value),
headers, and optionally a drip (the body sent one byte at a time, forever) or a body of ``huge_bytes`` streamed
with chunked encoding. It counts the requests it saw. A real HTTP server: the client goes through its whole stack.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Behaviour:
    status: int = 200
    body: Any = None  # bytes as they are; anything else as JSON
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    drip: bool = False  # announce the body, then send a byte every 0.1 s until the client hangs up
    huge_bytes: int = 0  # stream this many bytes (chunked) of a JSON string


class HostileEndpoint:
    def __init__(self) -> None:
        self.behaviour = Behaviour()
        self.requests = 0
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with endpoint._lock:
                    endpoint.requests += 1
                    behaviour = endpoint.behaviour
                try:
                    self._answer(behaviour)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up: what it should do
                    pass

            def _answer(self, behaviour: Behaviour) -> None:
                body = behaviour.body if isinstance(behaviour.body, bytes) else json.dumps(behaviour.body).encode()
                self.send_response(behaviour.status)
                for key, value in behaviour.headers.items():
                    self.send_header(key, value)
                if behaviour.huge_bytes:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self._chunk(b'{"choices": [{"text": "')
                    block = b"x" * (1 << 20)
                    for _ in range(behaviour.huge_bytes // len(block)):
                        self._chunk(block)
                    self._chunk(b'"}]}')
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_header("Content-Length", str(len(body) + (10**6 if behaviour.drip else 0)))
                self.end_headers()
                if behaviour.drip:
                    for byte in body * 1000:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                self.wfile.write(body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def behave(self, **kwargs: Any) -> None:
        with self._lock:
            self.behaviour = Behaviour(**kwargs)
            self.requests = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
