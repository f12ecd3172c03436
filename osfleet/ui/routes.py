"""The dashboard: ``/ui`` pages (server-rendered with Jinja2, a little JS, no build step) over a ``Backend``.

Who may see and do what is the API's rule: the operator sees everything, a client only its own replicas and
recorded episodes. Logging in (the operator's or a client's token) opens a server-side session (sessions.py:
the cookie holds its id, never the token; every state change checks the origin and a CSRF token). The live
view's socket is live.py. Nothing here is in the OpenAPI: the routes are the dashboard's, not the API's.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Query, Request, WebSocket, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import ValidationError
from starlette.requests import HTTPConnection

from osfleet.api.auth import Principal, client_address, principal_of_token
from osfleet.api.errors import NotFound
from osfleet.api.limits import LOGIN_MAX_BYTES, read_limited
from osfleet.ui.backend import Backend
from osfleet.ui.live import LiveView
from osfleet.ui.sessions import (
    COOKIE,
    COOKIE_PATH,
    LOGIN_COOKIE,
    SESSION_SECONDS,
    Gate,
    LoginNeeded,
    Session,
    Sessions,
    SessionsFull,
    csrf_ok,
    same_origin,
)

STATIC = {"ui.css": "text/css", "ui.js": "text/javascript"}
LOGIN_FORM_SECONDS = 3600
VIDEO_CHUNK_BYTES = 1 << 20  # an MP4 is streamed from its file in pieces of this size

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


# Who is asking, from the server's one ``Gate`` (installed on the app by ``install``).
def _gate(conn: HTTPConnection) -> Gate:
    gate: Gate = conn.app.state.ui_gate
    return gate


async def _page(request: Request) -> Session:
    return await _gate(request).page(request)


async def _reader(request: Request) -> Principal:
    return await _gate(request).reader(request)


async def _changer(request: Request) -> Principal:
    return await _gate(request).changer(request)


Page = Annotated[Session, Depends(_page)]
Reader = Annotated[Principal, Depends(_reader)]
Changer = Annotated[Principal, Depends(_changer)]


def _render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_env.get_template(name).render(**context), status_code=status_code)


def _cookie(resp: Response, request: Request, name: str, value: str, seconds: int) -> None:
    resp.set_cookie(
        name,
        value,
        max_age=seconds,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


# --- logging in and out ---------------------------------------------------------------------------------------
def _too_many(wait: int) -> str:
    return f"too many login attempts: try again in {wait} s"


def _throttled(resp: Response, wait: int) -> Response:
    resp.headers["Retry-After"] = str(wait)
    return resp


def _login_router(title: str) -> APIRouter:
    r = APIRouter(prefix="/ui", include_in_schema=False)

    def form(request: Request, status_code: int = 200, error: str | None = None) -> Response:
        """The login form, with a fresh CSRF token in a field and in a cookie (they must match on submit)."""
        csrf = secrets.token_urlsafe(32)
        resp = _render("login.html.j2", status_code, title=title, error=error, csrf=csrf)
        _cookie(resp, request, LOGIN_COOKIE, csrf, LOGIN_FORM_SECONDS)
        return resp

    @r.get("/login")
    def login_form(request: Request) -> Response:
        return form(request)

    @r.post("/login")
    async def login(request: Request) -> Response:
        gate = _gate(request)
        address = client_address(request)
        wait = gate.throttle.wait("address", address)
        if wait:  # before the token is even compared: a guesser learns nothing more
            return _throttled(form(request, status.HTTP_429_TOO_MANY_REQUESTS, _too_many(wait)), wait)
        fields = parse_qs((await read_limited(request, LOGIN_MAX_BYTES)).decode(errors="replace"))
        csrf = (fields.get("csrf") or [""])[0]
        if not same_origin(request) or not csrf_ok(request.cookies.get(LOGIN_COOKIE), csrf):
            return form(request, status.HTTP_403_FORBIDDEN, "the form expired or came from elsewhere: try again")
        token = (fields.get("token") or [""])[0].strip()
        who = principal_of_token(request.app.state.config, token) if token else None
        if who is None:
            gate.throttle.note("address", address)
            return form(request, status.HTTP_401_UNAUTHORIZED, "wrong token")
        wait = gate.throttle.wait("principal", who.name)
        if wait:
            return _throttled(form(request, status.HTTP_429_TOO_MANY_REQUESTS, _too_many(wait)), wait)
        gate.throttle.note("principal", who.name)
        try:  # a new id whatever cookie the browser brought; the session it had (if any) ends
            session = gate.sessions.create(who, replacing=request.cookies.get(COOKIE))
        except SessionsFull:
            wait = 60
            resp = form(request, status.HTTP_503_SERVICE_UNAVAILABLE, "the dashboard has too many sessions open")
            return _throttled(resp, wait)
        resp = RedirectResponse("/ui", status_code=status.HTTP_303_SEE_OTHER)
        _cookie(resp, request, COOKIE, session.id, int(SESSION_SECONDS))
        resp.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
        return resp

    @r.post("/logout")
    async def logout(request: Request) -> Response:
        gate = _gate(request)
        session = gate.session(request)
        resp = RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)
        if session is not None:
            fields = parse_qs((await read_limited(request, LOGIN_MAX_BYTES)).decode(errors="replace"))
            gate.check_change(request, session, (fields.get("csrf") or [""])[0])
            gate.sessions.end(session.id)
        resp.delete_cookie(COOKIE, path=COOKIE_PATH)
        return resp

    @r.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            raise NotFound(f"no file {name}")
        text = resources.files("osfleet.ui").joinpath("static", name).read_text()
        return Response(text, media_type=STATIC[name])

    return r


# --- pages ------------------------------------------------------------------------------------------------------
def _pages_router(backend: Callable[[], Backend], title: str) -> APIRouter:
    r = APIRouter(prefix="/ui", include_in_schema=False)

    def page(name: str, session: Session, status_code: int = 200, **context: Any) -> HTMLResponse:
        who = session.who.name if not session.who.operator else "operator"
        return _render(name, status_code, title=title, csrf=session.csrf, who=who, **context)

    @r.get("")
    async def dashboard(session: Page) -> Response:
        b = backend()
        replicas, figures = await asyncio.gather(b.replicas(session.who), b.figures(session.who))
        return page("dashboard.html.j2", session, kind=b.kind, replicas=replicas, figures=figures, now=time.time())

    @r.get("/replicas/{rid}")
    async def replica_page(rid: str, session: Page) -> Response:
        row = next((x for x in await backend().replicas(session.who) if x.id == rid), None)
        if row is None:
            return page("error.html.j2", session, 404, error=f"no replica {rid}")
        return page("replica.html.j2", session, replica=row)

    @r.get("/trajectories")
    async def trajectories_page(session: Page) -> Response:
        return page("trajectories.html.j2", session, episodes=await backend().trajectories(session.who))

    @r.get("/trajectories/{tid}")
    async def trajectory_page(tid: str, session: Page) -> Response:
        try:
            meta, steps = await backend().trajectory(tid, session.who)
        except NotFound as exc:
            return page("error.html.j2", session, 404, error=str(exc))
        return page("trajectory.html.j2", session, meta=meta, steps=steps)

    return r


# --- images, JSON (the gateway's way to its hosts' dashboards) and the person's input ---------------------------
def _api_router(backend: Callable[[], Backend]) -> APIRouter:
    r = APIRouter(prefix="/ui", include_in_schema=False)
    jpeg = {"Cache-Control": "no-store"}

    @r.get("/replicas/{rid}/screen.jpg")
    async def screen(rid: str, who: Reader, w: int | None = Query(None, ge=16, le=4096)) -> Response:
        return Response(await backend().screen(rid, w, who), media_type="image/jpeg", headers=jpeg)

    @r.get("/trajectories/{tid}/images/{name}")
    async def step_image(tid: str, name: str, who: Reader) -> Response:
        data, kind = await backend().image(tid, name, who)
        return Response(data, media_type=kind, headers={"Cache-Control": "private, max-age=3600"})

    @r.get("/api/replicas")
    async def api_replicas(who: Reader) -> list[dict[str, Any]]:
        return [x.model_dump(mode="json") for x in await backend().replicas(who)]

    @r.get("/api/replicas/{rid}/screen")
    async def api_screen(rid: str, who: Reader, w: int | None = Query(None, ge=16, le=4096)) -> Response:
        return Response(await backend().screen(rid, w, who), media_type="image/jpeg", headers=jpeg)

    @r.post("/api/replicas/{rid}/take-over")
    async def api_take(rid: str, who: Changer) -> dict[str, Any]:
        await backend().take_over(rid, who)
        return {"replica_id": rid, "taken_over": True}

    @r.post("/api/replicas/{rid}/hand-back")
    async def api_give(rid: str, who: Changer) -> dict[str, Any]:
        await backend().hand_back(rid, who)
        return {"replica_id": rid, "taken_over": False}

    @r.post("/api/replicas/{rid}/act")
    async def api_act(rid: str, request: Request, who: Changer) -> Response:
        try:
            actions = await request.json()
            results = await backend().act(rid, actions, who)
        except (ValueError, ValidationError) as exc:
            return JSONResponse({"error": str(exc).splitlines()[0], "kind": "invalid_action"}, status_code=422)
        return JSONResponse(results)

    @r.get("/api/trajectories")
    async def api_trajectories(who: Reader) -> list[dict[str, Any]]:
        return await backend().trajectories(who)

    @r.get("/api/trajectories/{tid}")
    async def api_trajectory(tid: str, who: Reader) -> dict[str, Any]:
        meta, steps = await backend().trajectory(tid, who)
        return {"meta": meta, "steps": steps}

    @r.get("/api/trajectories/{tid}/images/{name}")
    async def api_image(tid: str, name: str, who: Reader) -> Response:
        data, kind = await backend().image(tid, name, who)
        return Response(data, media_type=kind)

    @r.get("/trajectories/{tid}/video.mp4")
    @r.get("/api/trajectories/{tid}/video.mp4")
    async def video(tid: str, who: Reader) -> Response:
        """The episode as an MP4 (osfleet.recording.video), encoded for this request and streamed from its
        temporary file, removed at once (its bytes stay readable until sent): nothing is left however it ends."""
        path = await backend().video(tid, who)
        handle = path.open("rb")
        path.unlink()
        size = os.fstat(handle.fileno()).st_size

        def chunks() -> Iterator[bytes]:
            with handle:
                while block := handle.read(VIDEO_CHUNK_BYTES):
                    yield block

        headers = {"Content-Length": str(size), "Content-Disposition": f'attachment; filename="{tid}.mp4"'}
        return StreamingResponse(chunks(), media_type="video/mp4", headers=headers)

    return r


def _live_router(backend: Callable[[], Backend]) -> APIRouter:
    r = APIRouter(prefix="/ui", include_in_schema=False)

    @r.websocket("/ws/replicas/{rid}")
    async def live(ws: WebSocket, rid: str) -> None:
        gate = _gate(ws)
        session = gate.socket(ws)
        if session is None:
            await ws.close(code=status.WS_1008_POLICY_VIOLATION)
            return
        await ws.accept()
        if not await gate.socket_hello(ws, session):  # the CSRF token: the first message, never the URL
            await ws.close(code=status.WS_1008_POLICY_VIOLATION)
            return
        await LiveView(ws, backend(), rid, session.who).run()

    return r


def ui_router(backend: Callable[[], Backend], title: str) -> APIRouter:
    outer = APIRouter()
    for router in (_login_router(title), _pages_router(backend, title), _api_router(backend), _live_router(backend)):
        outer.include_router(router)
    return outer


def install(app: Any, backend: Callable[[], Backend], title: str) -> None:
    """Add the dashboard to ``app``: its routes, its sessions, and a redirect to the login form for pages."""
    app.state.ui_gate = Gate(Sessions())

    @app.exception_handler(LoginNeeded)
    async def _to_login(request: Request, exc: LoginNeeded) -> Response:
        return RedirectResponse("/ui/login", status_code=status.HTTP_303_SEE_OTHER)

    app.include_router(ui_router(backend, title))
