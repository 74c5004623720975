"""A loopback HTTP proxy in front of a real endpoint, for endpoint-failure tests.

It forwards every request to ``upstream`` and records the path and headers it saw. ``fail_next(n)`` answers
the next ``n`` requests with HTTP 500 (then forwards again), ``hang()`` holds requests without answering
until ``release()``. A real HTTP server on 127.0.0.1: the client under test goes through its whole stack.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


class LoopbackProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/").removesuffix("/v1")  # request paths already start with /v1
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.failures_left = 0
        self.failed = 0
        self._release = threading.Event()
        self._release.set()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy._lock:
                    proxy.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                    fail = proxy.failures_left > 0
                    if fail:
                        proxy.failures_left -= 1
                        proxy.failed += 1
                if fail:
                    return self._reply(500, b'{"error": "injected failure"}')
                if not proxy._release.wait(timeout=60):
                    return None
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
                response = httpx.request(method, proxy.upstream + self.path, content=body, headers=headers,
                                         timeout=120)
                self._reply(response.status_code, response.content)

            def _reply(self, status: int, payload: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def fail_next(self, n: int) -> None:
        with self._lock:
            self.failures_left = n

    def hang(self) -> None:
        self._release.clear()

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
