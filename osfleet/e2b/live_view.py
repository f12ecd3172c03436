"""e2b-desktop's live view, served with the fleet's capture: ``https://<port>-<sandbox id>.<domain>/vnc.html``.

``stream.start(require_auth=True)`` stores a password and starts x11vnc and noVNC in E2B's sandbox, and
``stream.get_url(auth_key=...)`` names the page by host: the port noVNC listens on and the sandbox id, under the
domain the SDK uses (E2B's "domain mode": wildcard DNS and TLS, docs: how-to/e2b.md). Here those lines only keep the
view's state (``desktop_lines``); a request whose ``Host`` names a sandbox's view port gets, instead of noVNC, a
page of its own that shows the desktop's screen, refreshed (``/vnc.html``), and the screen as a JPEG
(``/frame.jpg``), both for the view's password only (``?password=``, as E2B's URL carries it); any other host (the
daemon's ``49983-<id>`` too) goes to the routes. The view watches: it sends no input. A frame is taken at most every
``FRAME_SECONDS`` per sandbox, whoever watches.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from osfleet.client import FleetError
from osfleet.e2b.sandboxes import Sandbox, SandboxBook

HOST = re.compile(r"^(\d{1,5})-([0-9a-f]{20})\.")
FRAME_SECONDS = 0.5  # the view's refresh period, and the least time between two captures of one sandbox
FRAME_QUALITY = 70
PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>osfleet desktop</title>
<style>body{margin:0;background:#111}img{display:block;width:100vw;height:100vh;object-fit:contain}</style></head>
<body><img id="screen" alt="the desktop">
<script>
const password = new URLSearchParams(location.search).get("password") || "";
const screen = document.getElementById("screen");
function next() {
  screen.src = "frame.jpg?password=" + encodeURIComponent(password) + "&t=" + Date.now();
}
screen.onload = () => setTimeout(next, 500);
screen.onerror = () => setTimeout(next, 2000);
next();
</script></body></html>
"""


@dataclass
class _Frame:
    data: bytes = b""
    taken: float = 0.0


class LiveView:
    """ASGI middleware: requests for a sandbox's view host go to the view, all others to ``app``."""

    def __init__(self, app: ASGIApp, book: SandboxBook) -> None:
        self.app = app
        self.book = book
        self._frames: dict[str, _Frame] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = dict(scope.get("headers", ())).get(b"host", b"").decode("latin-1")
        named = HOST.match(host)
        sandbox = self.book.sandboxes.get(named.group(2)) if named is not None else None
        if named is None or sandbox is None or sandbox.desktop.view_port != int(named.group(1)):
            await self.app(scope, receive, send)  # the API, a daemon (49983-<id>.<domain>) or no view: the routes
            return
        status, kind, body = await self._answer(scope, sandbox)
        headers = [
            (b"content-type", kind),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope, sandbox: Sandbox) -> tuple[int, bytes, bytes]:
        view = sandbox.desktop
        if sandbox.session is None:
            return 404, b"text/plain", b"no live view here: the sandbox is paused\n"
        if scope.get("method") != "GET" or scope.get("path") not in ("/vnc.html", "/frame.jpg"):
            return 404, b"text/plain", b"the live view is /vnc.html\n"
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("password", [""])[0]
        if view.view_password is None or not hmac.compare_digest(given.encode(), view.view_password.encode()):
            return 401, b"text/plain", b"the live view needs its password (?password=)\n"
        if scope["path"] == "/vnc.html":
            return 200, b"text/html; charset=utf-8", PAGE
        try:
            return 200, b"image/jpeg", await self._frame(sandbox)
        except FleetError as exc:
            return 502, b"text/plain", f"no frame: {exc}\n".encode()

    async def _frame(self, sandbox: Sandbox) -> bytes:
        lock = self._locks.setdefault(sandbox.id, asyncio.Lock())
        async with lock:
            frame = self._frames.setdefault(sandbox.id, _Frame())
            if time.monotonic() - frame.taken >= FRAME_SECONDS:
                assert sandbox.session is not None
                shot = await sandbox.session.observe(format="jpeg", quality=FRAME_QUALITY)
                frame.data, frame.taken = shot.data, time.monotonic()
            for gone in [sid for sid in self._frames if sid not in self.book.sandboxes]:
                self._frames.pop(gone, None)
                self._locks.pop(gone, None)
            return frame.data
