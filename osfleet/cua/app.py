"""The ASGI app of ``osfleet cua serve``: Cua's computer-server routes over one leased desktop.

``POST /cmd`` answers a command as Cua's server does, one ``data: {json}`` line (cua-computer's REST path);
``/ws`` takes the same JSON commands over a WebSocket (its fallback), ``GET /status`` says the server is up (and
``linux``). The lease is taken when the app starts (and the desktop reset to ``task`` when one is given) and given
back when it stops, whatever stopped it.

Every request passes ``ServingGate`` first: cua-computer 0.4 sends no credentials to a computer-server on
``localhost``, so processes of this server's own user on loopback are let in (the kernel says whose a connection
is), and anyone else needs the server's own token (``Authorization: Bearer``); a web page's ``Origin`` must be
allowed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket, WebSocketDisconnect

from osfleet.client import AsyncFleet
from osfleet.cua.commands import Desk, answer
from osfleet.serving_gate import ServingGate

log = logging.getLogger(__name__)

MAX_BODY = 64 * 2**20  # bytes of one command (a write_bytes carries a file, base64)


@dataclass(frozen=True)
class LeaseOptions:
    """The desktop this server drives: a lease of ``url`` with ``token``, reset to ``task`` when given."""

    url: str
    token: str
    task: str | Path | None = None
    ttl: float | None = None
    wait: float = 300.0
    verify: bool | str = True


def create_app(options: LeaseOptions, token: str, origins: Sequence[str] | None = None) -> ASGIApp:
    """The computer-server over one desktop leased with ``options``; ``token`` is the server's own."""
    state: dict[str, Desk] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with AsyncFleet(options.url, token=options.token, verify=options.verify) as fleet:
            session = await fleet.lease("cua", ttl=options.ttl, wait=options.wait)
            try:
                if options.task is not None:
                    await session.reset(options.task, observe=False)
                state["desk"] = Desk(session)
                log.info("cua: serving replica %s", session.replica_id)
                yield
            finally:
                await session.release()

    async def cmd(request: Request) -> Response:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY:
            return JSONResponse({"detail": f"a command is at most {MAX_BODY} bytes"}, status_code=413)
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY:
                return JSONResponse({"detail": f"a command is at most {MAX_BODY} bytes"}, status_code=413)
        try:
            body = json.loads(raw)
        except ValueError:
            return JSONResponse({"detail": "the body is not JSON"}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"detail": "the body is a JSON object"}, status_code=400)
        result = await answer(state["desk"], body.get("command"), body.get("params"))
        return PlainTextResponse(f"data: {json.dumps(result)}\n\n", headers={"Cache-Control": "no-cache"})

    async def status(request: Request) -> Response:
        return JSONResponse({"status": "ok", "os_type": "linux", "features": []})

    async def websocket(ws: WebSocket) -> None:
        await ws.accept()
        try:
            while True:
                text = await ws.receive_text()
                if len(text) > MAX_BODY:
                    await ws.send_json({"success": False, "error": f"a command is at most {MAX_BODY} bytes"})
                    continue
                try:
                    body = json.loads(text)
                except ValueError:
                    await ws.send_json({"success": False, "error": "the message is not JSON"})
                    continue
                if not isinstance(body, dict):
                    await ws.send_json({"success": False, "error": "the message is a JSON object"})
                    continue
                await ws.send_json(await answer(state["desk"], body.get("command"), body.get("params")))
        except WebSocketDisconnect:
            return

    app = Starlette(
        routes=[
            Route("/cmd", cmd, methods=["POST"]),
            Route("/status", status, methods=["GET"]),
            WebSocketRoute("/ws", websocket),
        ],
        lifespan=lifespan,
    )
    return ServingGate(app, token, same_user_peers=True, origins=origins)
