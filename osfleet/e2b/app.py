"""The ASGI app of ``osfleet e2b serve``: E2B's control plane and every sandbox's daemon on one port.

E2B's SDKs reach both through ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` set to this server; their paths do not
overlap (``/sandboxes``, ``/v2/sandboxes`` for the one; ``/health``, ``/files``, ``/process.Process/*``,
``/filesystem.Filesystem/*`` for the other). The app's lifespan owns the ``SandboxBook``: a task ends sandboxes whose
timeout passed (every ``EXPIRY_SECONDS``), and shutting down kills them all, so no lease outlives the server that
took it.

A request whose ``Host`` names a sandbox's view (``<port>-<sandbox id>.<domain>``) goes to its live view
(``live_view``). A request carrying ``Origin`` comes from a web page: it must be one of the allowed origins
(default: this server's own), else 403, so a page a browser opens cannot drive the desktops of a key the browser
never had (the SDKs send no ``Origin``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from e2b.envd.filesystem import filesystem_connect
from e2b.envd.process import process_connect
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from osfleet.client import FleetError
from osfleet.e2b import control, envd
from osfleet.e2b.errors import E2BError
from osfleet.e2b.live_view import LiveView
from osfleet.e2b.sandboxes import SandboxBook
from osfleet.serving_gate import own_origins

log = logging.getLogger(__name__)

EXPIRY_SECONDS = 1.0  # how often sandboxes past their timeout are looked for


class OriginGate:
    """403 for a request from a web page of an origin not allowed (``origins``: patterns; None: this server's)."""

    def __init__(self, app: ASGIApp, origins: Sequence[str] | None) -> None:
        self.app = app
        self.origins = tuple(origins) if origins is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = dict(scope.get("headers", ())).get(b"origin")
            port = int(scope["server"][1]) if scope.get("server") else 0
            allowed = self.origins if self.origins is not None else own_origins(port)
            if origin is not None and not any(fnmatch.fnmatchcase(origin.decode("latin-1"), p) for p in allowed):
                body = json.dumps({"code": 403, "message": "this Origin may not call the server"}).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 403, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def create_app(book: SandboxBook, origins: Sequence[str] | None = None) -> ASGIApp:
    """The server over ``book`` (whose sandboxes it kills when it stops)."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_expire(book))
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await book.close()

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        return envd.error_response(E2BError(status, f"{request.method} {request.url.path}: no such route here"))

    async def health(request: Request) -> Response:
        return await envd.health(book, request)

    async def read_file(request: Request) -> Response:
        return await envd.read_file(book, request)

    async def write_file(request: Request) -> Response:
        return await envd.write_file(book, request)

    process = process_connect.ProcessASGIApplication(envd.ProcessService(book))
    files = filesystem_connect.FilesystemASGIApplication(envd.FilesystemService(book))
    app = Starlette(
        routes=[
            *control.routes(),
            Route("/health", health, methods=["GET"]),
            Route("/files", read_file, methods=["GET"]),
            Route("/files", write_file, methods=["POST"]),
            Mount(process.path, app=process),
            Mount(files.path, app=files),
        ],
        exception_handlers={404: not_found, 405: not_found},
        lifespan=lifespan,
    )
    app.state.book = book
    return OriginGate(LiveView(app, book), origins)


async def _expire(book: SandboxBook) -> None:
    while True:
        await asyncio.sleep(EXPIRY_SECONDS)
        try:
            ended = await book.expire()
        except (E2BError, FleetError) as exc:  # the fleet failed this round: the next one tries again
            log.warning("e2b: ending sandboxes past their timeout failed (%s); trying again", exc)
            continue
        if ended:
            log.info("e2b: sandboxes past their timeout: %s", ", ".join(ended))
