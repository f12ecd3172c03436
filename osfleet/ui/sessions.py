"""Who is using the dashboard: server-side sessions, and the checks every state change passes.

Logging in exchanges a token (the operator's or a client's) for a session: the cookie holds a random session
id (HTTP-only, ``SameSite=Strict``, scoped to ``/ui``), never the token, and the session remembers whose it is
and its CSRF token. Every state change made with the cookie — take-over, hand-back, input, logout, and the
login itself — must come from the dashboard's own origin (``Origin``, when the browser sends it, names this
host) and carry the CSRF token (a form field, the ``X-CSRF-Token`` header, or the live view's ``csrf`` query
parameter). A bearer token in ``Authorization`` (the gateway reaching its hosts' ``/ui/api``, scripts) is no
ambient credential and needs neither.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, WebSocket, status
from starlette.requests import HTTPConnection

from osfleet.api import auth
from osfleet.api.auth import Principal

COOKIE = "osfleet_ui"
LOGIN_COOKIE = "osfleet_ui_login"  # the login form's CSRF token (before there is a session)
COOKIE_PATH = "/ui"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 10000
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class Session:
    id: str
    who: Principal
    csrf: str
    expires: float


class Sessions:
    """Live dashboard sessions of one server (in memory: a restarted server asks everyone to log in again)."""

    def __init__(self, seconds: float = SESSION_SECONDS) -> None:
        self.seconds = seconds
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, who: Principal) -> Session:
        session = Session(secrets.token_urlsafe(32), who, secrets.token_urlsafe(32), time.time() + self.seconds)
        with self._lock:
            now = time.time()
            self._by_id = {k: v for k, v in self._by_id.items() if v.expires > now}
            while len(self._by_id) >= MAX_SESSIONS:  # the oldest go first
                self._by_id.pop(next(iter(self._by_id)))
            self._by_id[session.id] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            session = self._by_id.get(sid)
            if session is not None and session.expires <= time.time():
                del self._by_id[sid]
                return None
        return session

    def end(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


class LoginNeeded(Exception):
    """A page was asked for without a session: the browser is sent to the login form."""


def same_origin(conn: HTTPConnection) -> bool:
    """A browser's request (or socket) comes from the dashboard's own origin, or says nothing of it."""
    origin = conn.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == conn.headers.get("host")


def csrf_ok(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _forbidden(why: str) -> HTTPException:
    return HTTPException(status.HTTP_403_FORBIDDEN, why)


class Gate:
    """The dashboard's checks, as FastAPI dependencies over one ``Sessions``."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    def session(self, conn: HTTPConnection) -> Session | None:
        return self.sessions.get(conn.cookies.get(COOKIE))

    async def page(self, request: Request) -> Session:
        """Pages: a session, else the login form."""
        session = self.session(request)
        if session is None:
            raise LoginNeeded
        return session

    async def reader(self, request: Request) -> Principal:
        """Images and JSON: a session, or a bearer token (the gateway reaching a host's /ui/api)."""
        who = auth.authenticate(request)
        if who is not None:
            return who
        session = self.session(request)
        if session is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "log in at /ui/login", {"WWW-Authenticate": "Bearer"})
        return session.who

    async def changer(self, request: Request) -> Principal:
        """State changes: a bearer token; or a session, from this origin, with its CSRF token."""
        who = auth.authenticate(request)
        if who is not None:
            return who
        session = self.session(request)
        if session is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "log in at /ui/login", {"WWW-Authenticate": "Bearer"})
        self.check_change(request, session, request.headers.get(CSRF_HEADER))
        return session.who

    def check_change(self, conn: HTTPConnection, session: Session, csrf: str | None) -> None:
        if not same_origin(conn):
            raise _forbidden("this change did not come from the dashboard's own origin")
        if not csrf_ok(csrf, session.csrf):
            raise _forbidden("missing or wrong CSRF token: reload the page")

    def socket(self, ws: WebSocket) -> Session | None:
        """The live view's socket: a session, from this origin, with its CSRF token in the URL."""
        session = self.session(ws)
        if session is None or not same_origin(ws) or not csrf_ok(ws.query_params.get("csrf"), session.csrf):
            return None
        return session
