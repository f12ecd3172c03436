"""A guest's local HTTP service (VLC's HTTP interface) reachable from the host: each request replayed in the guest.

OSWorld's VLC getters ask ``http://<vm>:<vlc_port>/requests/status.xml`` with ``requests`` from the machine that
runs the benchmark. An osfleet replica has no network, so ``GuestHttpRelay`` listens on a loopback port of its own
and sends each request it receives into the guest as one ``shell`` step of the lease: the guest's python3 asks
``127.0.0.1:<guest port>`` (``RELAY_SCRIPT``) and prints the answer (status, content type, body in base64) as one
JSON line, which the relay answers with. It is HTTP request by request, not a byte stream: enough for VLC's
interface (plain GETs with basic authentication), not for a WebSocket (Chrome's DevTools).

Like the protocol server, it answers only the process that leased the replica (or a holder of its secret), never
a browser page (``local_gate``). When nothing listens in the guest (VLC not running) the relay closes the connection
without an answer, so the
caller's ``requests`` raises a connection error as it does against an OSWorld VM whose port is closed. Bodies are
bounded both ways (``MAX_REQUEST_BYTES``, ``MAX_ANSWER_BYTES``: a guest's answer is hostile input) and the
guest's JSON line is parsed with its fields checked before anything is answered.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import shlex
import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any, Protocol, cast

from osfleet.client import FleetError
from osfleet.osworld.errors import GuestFailed
from osfleet.osworld.local_gate import GatedHandler, LocalGate

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
MAX_REQUEST_BYTES = 64 * 1024  # VLC's interface takes commands in the query string; bodies are tiny
MAX_ANSWER_BYTES = 4 * 2**20  # status.xml and playlist.xml are a few KiB; a guest answering more is cut off
REQUEST_SECONDS = 20.0  # the guest's wait for its own service
STEP_SECONDS = REQUEST_SECONDS + 10.0
READ_SECONDS = 30.0
STOP_SECONDS = 10.0
POLL_SECONDS = 0.1
FORWARDED_HEADERS = ("Authorization", "Content-Type", "Accept")
# Runs in the guest (python3's standard library): argv = port, method, path, max bytes, timeout; the request's
# headers and body (base64) as a JSON object on stdin... which a shell step cannot give, so they come in argv too.
RELAY_SCRIPT = r"""
import base64, json, sys, urllib.error, urllib.request
port, method, path, limit, timeout, headers, body = sys.argv[1:8]
req = urllib.request.Request("http://127.0.0.1:%d%s" % (int(port), path), method=method,
                             headers=json.loads(headers), data=base64.b64decode(body) or None)
try:
    try:
        r = urllib.request.urlopen(req, timeout=float(timeout))
    except urllib.error.HTTPError as e:
        r = e
    data = r.read(int(limit) + 1)
    print(json.dumps({"status": r.status if hasattr(r, "status") else r.code,
                      "content_type": r.headers.get("Content-Type", ""),
                      "body": base64.b64encode(data[:int(limit)]).decode(), "cut": len(data) > int(limit)}))
except (OSError, ValueError) as e:
    print(json.dumps({"refused": str(e)[:200]}))
"""


class Shell(Protocol):
    """Runs a command in the leased guest as the desktop user (``Endpoints.shell``)."""

    def __call__(self, command: str, timeout: float, what: str) -> Any: ...


@dataclass(frozen=True)
class GuestAnswer:
    """What the guest's service answered, checked."""

    status: int
    content_type: str
    body: bytes


class GuestRefused(Exception):
    """Nothing answered on the guest's port (or the guest could not ask it)."""


def guest_request(shell: Shell, port: int, method: str, path: str, headers: dict[str, str], body: bytes) -> GuestAnswer:
    """Ask the guest's ``127.0.0.1:port`` for ``method path`` and return its answer (``GuestRefused`` if none)."""
    argv = [
        "python3", "-c", RELAY_SCRIPT, str(port), method, path, str(MAX_ANSWER_BYTES), str(REQUEST_SECONDS),
        json.dumps(headers), base64.b64encode(body).decode(),
    ]  # fmt: skip
    ran = shell(shlex.join(argv), STEP_SECONDS, f"guest port {port}")
    return parse_answer(ran.stdout, ran.exit_code)


def parse_answer(stdout: str, exit_code: int) -> GuestAnswer:
    """The relay script's one JSON line, every field checked (the guest wrote it)."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if exit_code != 0 or not lines:
        raise GuestRefused(f"the guest's relay gave no answer (exit {exit_code})")
    try:
        data = json.loads(lines[-1])
    except ValueError:
        raise GuestRefused("the guest's relay answered something that is not JSON") from None
    if not isinstance(data, dict):
        raise GuestRefused("the guest's relay answered something that is not a JSON object")
    if "refused" in data:
        raise GuestRefused(f"nothing answered in the guest: {str(data['refused'])[:200]}")
    status, content_type, encoded = data.get("status"), data.get("content_type", ""), data.get("body")
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        raise GuestRefused("the guest's relay gave no valid HTTP status")
    if not isinstance(content_type, str) or len(content_type) > 200 or not content_type.isprintable():
        raise GuestRefused("the guest's relay gave an invalid content type")
    if not isinstance(encoded, str) or len(encoded) > (MAX_ANSWER_BYTES * 4) // 3 + 4:
        raise GuestRefused("the guest's relay gave no body, or one over the limit")
    try:
        body = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise GuestRefused("the guest's relay gave a body that is not base64") from None
    return GuestAnswer(status, content_type, body)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    relay: GuestHttpRelay
    gate: LocalGate


class _Handler(GatedHandler):
    protocol_version = "HTTP/1.1"
    server_version = "osfleet-guest-relay"
    timeout = READ_SECONDS

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._relay()

    def do_POST(self) -> None:  # noqa: N802
        self._relay()

    def do_HEAD(self) -> None:  # noqa: N802
        self._relay()

    def _relay(self) -> None:
        relay = cast(_HTTPServer, self.server).relay
        refused = self.refusal()
        if refused is not None:  # the same gate as the protocol server's (osworld.local_gate): its body unread
            self.close_connection = True
            self._answer(refused[0], "text/plain", refused[1].encode())
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_REQUEST_BYTES or "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._answer(413, "text/plain", f"request bodies up to {MAX_REQUEST_BYTES} bytes, with a length".encode())
            self.close_connection = True
            return
        body = self.rfile.read(length) if length else b""
        headers = {k: v for k in FORWARDED_HEADERS if (v := self.headers.get(k)) is not None}
        try:
            answer = guest_request(relay.shell, relay.guest_port, self.command, self.path, headers, body)
        except (GuestRefused, GuestFailed, FleetError) as exc:
            # as a closed port of an OSWorld VM: no answer, the caller sees a connection error
            log.info("guest port %d: %s %s: %s", relay.guest_port, self.command, self.path, exc)
            self.close_connection = True
            return
        self._answer(answer.status, answer.content_type, answer.body)

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        log.debug("%s " + format, self.address_string(), *args)


class GuestHttpRelay:
    """The guest's HTTP service on ``guest_port``, served on ``127.0.0.1:<port>`` (the module's docstring)."""

    def __init__(self, shell: Shell, guest_port: int, port: int = 0) -> None:
        self.shell, self.guest_port = shell, guest_port
        self._httpd = _HTTPServer((LOOPBACK, port), _Handler)
        self._httpd.relay = self
        self._httpd.gate = LocalGate()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> GuestHttpRelay:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, args=(POLL_SECONDS,), name=f"guest-http-{self.port}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and free the port (idempotent)."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(STOP_SECONDS)
            self._thread = None
        self._httpd.server_close()
