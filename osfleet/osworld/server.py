"""The protocol server: OSWorld's in-VM HTTP server, served on 127.0.0.1 for one leased replica.

The standard library's ``ThreadingHTTPServer`` (one thread a connection; OSWorld's controllers send one request
at a time per environment, its getters a few more), HTTP/1.1 with keep-alive as ``requests`` uses it. A request
is routed before its body is read: an unknown path, the wrong method, a body without ``Content-Length`` or over
the endpoint's limit is refused without keeping the body (a body up to ``DRAIN_BYTES`` is read and dropped, so
its client is not still sending when the answer comes). The body is then read whole, within ``READ_SECONDS`` of
silence, and handed to ``endpoints``.

It listens on the loopback only, and whoever can use it acts as the desktop user of the replica, so unlike
OSWorld's own server it lets in only the process that leased the replica (or a holder of its per-lease secret),
and no browser page (``local_gate``): each request is checked before its body is read.
"""

from __future__ import annotations

import logging
import threading
from http.server import ThreadingHTTPServer
from typing import cast
from urllib.parse import urlsplit

from osfleet.osworld.endpoints import Answer, Endpoints, ErrorShape, Request, Route, route_for
from osfleet.osworld.errors import HarnessError, LengthRequired, TooLarge
from osfleet.osworld.local_gate import GatedHandler, LocalGate

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
READ_SECONDS = 60.0  # a client silent this long while sending its request is dropped
STOP_SECONDS = 10.0
POLL_SECONDS = 0.1  # how soon the serving thread notices a stop
DRAIN_BYTES = 32 * 2**20  # the most of a refused body read (and dropped) so that its client sees the answer
DRAIN_CHUNK = 1 << 16


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    endpoints: Endpoints
    gate: LocalGate


class _Handler(GatedHandler):
    protocol_version = "HTTP/1.1"
    server_version = "osfleet-osworld"
    timeout = READ_SECONDS

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve()

    def do_POST(self) -> None:  # noqa: N802
        self._serve()

    def do_PUT(self) -> None:  # noqa: N802
        self._serve()

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve()

    def _serve(self) -> None:
        path = urlsplit(self.path).path
        endpoints = cast(_HTTPServer, self.server).endpoints
        refused = self.refusal()
        if refused is not None:
            self.close_connection = True  # its body is not read
            self._send(ErrorShape.ERROR.answer(*refused))
            return
        route: Route | None = None
        try:
            route = route_for(self.command, path)
            body = self._body(route.max_body)
        except HarnessError as exc:
            shape = route.errors if route is not None else ErrorShape.ERROR
            self._discard_body()
            self._send(shape.answer(exc.status, str(exc)))
            return
        request = Request(self.command, path, self.headers.get("Content-Type", ""), body)
        self._send(endpoints.handle(route, request))

    def _body(self, limit: int) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise LengthRequired("send the body with a Content-Length (chunked bodies are not read)")
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        try:
            length = int(raw)
        except ValueError:
            raise LengthRequired(f"Content-Length {raw!r} is not a number") from None
        if length < 0:
            raise LengthRequired(f"Content-Length {raw!r} is not a number of bytes")
        if length > limit:
            raise TooLarge(f"a body of {length} bytes is over this endpoint's limit of {limit} bytes")
        return self.rfile.read(length)

    def _discard_body(self) -> None:
        """Read and drop the body of a refused request, when it is small enough (``DRAIN_BYTES``): a client still
        sending it when the connection closes may lose the answer to a reset. A larger one, or one without a
        length, is not read: the connection closes after the answer."""
        try:
            left = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            left = -1
        if not 0 <= left <= DRAIN_BYTES or "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            return
        while left > 0:
            chunk = self.rfile.read(min(left, DRAIN_CHUNK))
            if not chunk:
                self.close_connection = True
                return
            left -= len(chunk)

    def _send(self, answer: Answer) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        log.debug("%s " + format, self.address_string(), *args)


class ProtocolServer:
    """OSWorld's in-VM server for one desktop, on ``127.0.0.1:<port>`` (``port`` 0: one the system picks)."""

    def __init__(self, endpoints: Endpoints, port: int = 0) -> None:
        self._httpd = _HTTPServer((LOOPBACK, port), _Handler)
        self._httpd.endpoints = endpoints
        self._httpd.gate = LocalGate()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def secret(self) -> str:
        """The per-lease secret another process may present (``Authorization: Bearer <secret>``)."""
        return self._httpd.gate.secret

    def start(self) -> ProtocolServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                args=(POLL_SECONDS,),
                name=f"osworld-protocol-{self.port}",
                daemon=True,
            )
            self._thread.start()
            log.info("OSWorld protocol server for %s on %s:%d", self._httpd.endpoints.desktop, LOOPBACK, self.port)
        return self

    def stop(self) -> None:
        """Stop answering and free the port (idempotent)."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(STOP_SECONDS)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ProtocolServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
