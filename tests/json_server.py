"""A real HTTP server on loopback whose JSON answers the test decides: it stands in for an API server, a gateway or
a host that a unit test must not start, so the code under test still speaks real HTTP (its own requests, timeouts,
status handling) and the test sees every request it made."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the JSON sent, or None


Answer = Callable[[Request], tuple[int, Any]]  # a request -> (status, JSON body)


@contextmanager
def json_server(answer: Answer) -> Iterator[tuple[str, list[Request]]]:
    """``(http://127.0.0.1:PORT, the requests seen so far)`` while the block runs; each request is answered
    ``answer(request)`` as JSON."""
    seen: list[Request] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(self.command, self.path, dict(self.headers), json.loads(raw) if raw else None)
            seen.append(request)
            status, body = answer(request)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)
