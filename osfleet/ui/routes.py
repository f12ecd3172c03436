"""The dashboard: ``/ui`` pages (server-rendered with Jinja2, a little JS, no build step) over a ``Backend``.

Same auth as the API: the login form takes the bearer token and keeps it in an HTTP-only, SameSite=Strict
cookie scoped to ``/ui`` (never in a URL); every ``/ui`` route compares the cookie (or a bearer header, which
the gateway uses to reach its hosts' ``/ui/api``) with the token in constant time. Nothing here is in the
OpenAPI: the routes are the dashboard's, not the API's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Depends, HTTPException, Query, Request, WebSocket, WebSocketDisconnect, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import ValidationError

from osfleet.api.errors import Conflict, NotFound
from osfleet.errors import OsfleetError
from osfleet.ui.backend import Backend

log = logging.getLogger(__name__)

COOKIE = "osfleet_ui"
COOKIE_PATH = "/ui"
COOKIE_MAX_AGE = 12 * 3600
FRAME_SECONDS = 0.5  # the live view's refresh period (a frame is sent only when the screen changed)
STATIC = {"ui.css": "text/css", "ui.js": "text/javascript"}

_env = Environment(loader=PackageLoader("osfleet.ui", "templates"), autoescape=select_autoescape(["j2", "html"]))
_env.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else "-"
_env.filters["age"] = lambda t: _age(time.time() - t) if t else "-"
_env.filters["mib"] = lambda n: f"{n / 2**20:,.0f} MiB" if isinstance(n, int | float) else "-"


def _age(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _token_ok(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _authorised(conn: Request | WebSocket) -> bool:
    expected: str = conn.app.state.config.token
    scheme, _, value = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and _token_ok(value.strip(), expected):
        return True
    return _token_ok(conn.cookies.get(COOKIE), expected)


class _LoginNeeded(Exception):
    pass


def _page_auth(request: Request) -> None:
    if not _authorised(request):
        raise _LoginNeeded


def _api_auth(request: Request) -> None:
    if not _authorised(request):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "log in at /ui/login", {"WWW-Authenticate": "Bearer"})


def _render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_env.get_template(name).render(**context), status_code=status_code)


def _same_origin(ws: WebSocket) -> bool:
    """A browser's WebSocket must come from the dashboard's own origin (no cross-site socket hijacking)."""
    origin = ws.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == ws.headers.get("host")


def ui_router(backend: Callable[[], Backend], title: str) -> APIRouter:
    r = APIRouter(prefix="/ui", include_in_schema=False)

    # --- login --------------------------------------------------------------------------------------------------
    @r.get("/login")
    def login_form(request: Request) -> Response:
        return _render("login.html.j2", title=title, error=None)

    @r.post("/login")
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace"))
        token = (form.get("token") or [""])[0].strip()
        if not _token_ok(token, request.app.state.config.token):
            return _render("login.html.j2", status.HTTP_401_UNAUTHORIZED, title=title, error="wrong token")
        resp = RedirectResponse("/ui", status_code=status.HTTP_303_SEE_OTHER)
        resp.set_cookie(
            COOKIE,
            token,
            max_age=COOKIE_MAX_AGE,
            path=COOKIE_PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return resp

    @r.post("/logout")
    def logout() -> Response:
        resp = RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)
        resp.delete_cookie(COOKIE, path=COOKIE_PATH)
        return resp

    @r.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            raise NotFound(f"no file {name}")
        text = resources.files("osfleet.ui").joinpath("static", name).read_text()
        return Response(text, media_type=STATIC[name])

    # --- pages ------------------------------------------------------------------------------------------------
    pages = APIRouter(prefix="/ui", dependencies=[Depends(_page_auth)], include_in_schema=False)

    @pages.get("")
    async def dashboard() -> Response:
        b = backend()
        replicas, figures = await asyncio.gather(b.replicas(), b.figures())
        return _render(
            "dashboard.html.j2", title=title, kind=b.kind, replicas=replicas, figures=figures, now=time.time()
        )

    @pages.get("/replicas/{rid}")
    async def replica_page(rid: str) -> Response:
        b = backend()
        row = next((x for x in await b.replicas() if x.id == rid), None)
        if row is None:
            return _render("error.html.j2", 404, title=title, error=f"no replica {rid}")
        return _render("replica.html.j2", title=title, replica=row)

    @pages.get("/trajectories")
    async def trajectories_page() -> Response:
        return _render("trajectories.html.j2", title=title, episodes=await backend().trajectories())

    @pages.get("/trajectories/{tid}")
    async def trajectory_page(tid: str) -> Response:
        try:
            meta, steps = await backend().trajectory(tid)
        except NotFound as exc:
            return _render("error.html.j2", 404, title=title, error=str(exc))
        return _render("trajectory.html.j2", title=title, meta=meta, steps=steps)

    # --- images and the live view (pages' parts) ---------------------------------------------------------------
    parts = APIRouter(prefix="/ui", dependencies=[Depends(_api_auth)], include_in_schema=False)

    @parts.get("/replicas/{rid}/screen.jpg")
    async def screen(rid: str, w: int | None = Query(None, ge=16, le=4096)) -> Response:
        return Response(await backend().screen(rid, w), media_type="image/jpeg", headers={"Cache-Control": "no-store"})

    @parts.get("/trajectories/{tid}/images/{name}")
    async def step_image(tid: str, name: str) -> Response:
        data, kind = await backend().image(tid, name)
        return Response(data, media_type=kind, headers={"Cache-Control": "private, max-age=3600"})

    # --- JSON for the gateway's dashboard (and scripts) -------------------------------------------------------
    @parts.get("/api/replicas")
    async def api_replicas() -> list[dict[str, Any]]:
        return [x.model_dump(mode="json") for x in await backend().replicas()]

    @parts.get("/api/replicas/{rid}/screen")
    async def api_screen(rid: str, w: int | None = Query(None, ge=16, le=4096)) -> Response:
        return Response(await backend().screen(rid, w), media_type="image/jpeg", headers={"Cache-Control": "no-store"})

    @parts.post("/api/replicas/{rid}/take-over")
    async def api_take(rid: str) -> dict[str, Any]:
        await backend().take_over(rid)
        return {"replica_id": rid, "taken_over": True}

    @parts.post("/api/replicas/{rid}/hand-back")
    async def api_give(rid: str) -> dict[str, Any]:
        await backend().hand_back(rid)
        return {"replica_id": rid, "taken_over": False}

    @parts.post("/api/replicas/{rid}/act")
    async def api_act(rid: str, request: Request) -> Response:
        try:
            actions = await request.json()
            results = await backend().act(rid, actions)
        except (ValueError, ValidationError) as exc:
            return JSONResponse({"error": str(exc).splitlines()[0], "kind": "invalid_action"}, status_code=422)
        return JSONResponse(results)

    @parts.get("/api/trajectories")
    async def api_trajectories() -> list[dict[str, Any]]:
        return await backend().trajectories()

    @parts.get("/api/trajectories/{tid}")
    async def api_trajectory(tid: str) -> dict[str, Any]:
        meta, steps = await backend().trajectory(tid)
        return {"meta": meta, "steps": steps}

    @parts.get("/api/trajectories/{tid}/images/{name}")
    async def api_image(tid: str, name: str) -> Response:
        data, kind = await backend().image(tid, name)
        return Response(data, media_type=kind)

    # --- the live view's socket -------------------------------------------------------------------------------
    @r.websocket("/ws/replicas/{rid}")
    async def live(ws: WebSocket, rid: str) -> None:
        if not _authorised(ws) or not _same_origin(ws):
            await ws.close(code=status.WS_1008_POLICY_VIOLATION)
            return
        await ws.accept()
        b = backend()
        holding = False

        async def say(**body: Any) -> None:
            await ws.send_text(json.dumps(body))

        async def frames() -> None:
            last = b""
            while True:
                try:
                    frame = await b.screen(rid, None)
                except OsfleetError as exc:
                    await say(type="error", error=str(exc))
                    frame = b""
                digest = hashlib.sha1(frame).digest()
                if frame and digest != last:
                    await ws.send_bytes(frame)
                    last = digest
                await asyncio.sleep(FRAME_SECONDS)

        sender = asyncio.create_task(frames())
        try:
            while True:
                msg = json.loads(await ws.receive_text())
                op = msg.get("op") if isinstance(msg, dict) else None
                try:
                    if op == "take":
                        await b.take_over(rid)
                        holding = True
                        await say(type="status", taken_over=True)
                    elif op == "give":
                        await b.hand_back(rid)
                        holding = False
                        await say(type="status", taken_over=False)
                    elif op == "act":
                        if not holding:
                            raise Conflict("take over before sending input")
                        results = await b.act(rid, msg.get("actions") or [])
                        await say(type="acted", results=results)
                    else:
                        await say(type="error", error=f"unknown op {op!r}")
                except (OsfleetError, ValidationError, ValueError) as exc:
                    await say(type="error", error=str(exc).splitlines()[0])
        except (WebSocketDisconnect, json.JSONDecodeError, KeyError):  # gone, or not JSON text
            pass
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            if holding:  # a closed tab hands the replica back
                with contextlib.suppress(OsfleetError):
                    await b.hand_back(rid)

    outer = APIRouter()
    for router in (r, pages, parts):
        outer.include_router(router)
    return outer


def install(app: Any, backend: Callable[[], Backend], title: str) -> None:
    """Add the dashboard to ``app``: its routes, and a redirect to the login form for pages."""

    @app.exception_handler(_LoginNeeded)
    async def _to_login(request: Request, exc: _LoginNeeded) -> Response:
        return RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)

    app.include_router(ui_router(backend, title))
