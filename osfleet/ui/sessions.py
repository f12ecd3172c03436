"""Who is using the dashboard: server-side sessions, and the checks every state change passes.

Logging in exchanges a token (the operator's or a client's) for a session: the cookie holds a random session
id (HTTP-only, ``SameSite=Strict``, scoped to ``/ui``), never the token, and the session remembers whose it is
and its CSRF token. Every state change made with the cookie — take-over, hand-back, input, logout, and the
login itself — must come from the dashboard's own origin (``Origin``, when the browser sends it, names this
host) and carry the CSRF token (a form field, the ``X-CSRF-Token`` header, or the live view's first message on
its socket: never in a URL, which ends up in access logs and browser history). A bearer token in
``Authorization`` (the gateway reaching its hosts' ``/ui/api``, scripts) is no ambient credential and needs
neither.

Sessions are counted per principal: a principal's own oldest session makes room for its new one, and nobody's
login ends anybody else's session (the server refuses new logins when it is full instead). Logins are throttled
(``LoginThrottle``): wrong tokens per address, and logins per principal, each answered 429 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, WebSocket, WebSocketDisconnect, status
from starlette.requests import HTTPConnection

from osfleet.api import auth
from osfleet.api.auth import Principal

COOKIE = "osfleet_ui"
LOGIN_COOKIE = "osfleet_ui_login"  # the login form's CSRF token (before there is a session)
COOKIE_PATH = "/ui"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 10000
SESSIONS_PER_PRINCIPAL = 32  # browsers and tabs of one person or team; their oldest makes room
CSRF_HEADER = "x-csrf-token"
SOCKET_HELLO_SECONDS = 10.0  # the live view's first message (its CSRF token) must come within this
# Login throttling: wrong tokens per address, logins per principal, each within a sliding window.
LOGIN_WINDOW_SECONDS = 300.0
LOGIN_FAILURES_PER_ADDRESS = 10
LOGINS_PER_PRINCIPAL = 30
THROTTLE_KEYS = 10000  # addresses and principals remembered at most (the least recently seen go first)


@dataclass(frozen=True)
class Session:
    id: str
    who: Principal
    csrf: str
    expires: float


class SessionsFull(Exception):
    """Every session slot is taken by live sessions: a new login waits, nobody else's session is ended."""


class Sessions:
    """Live dashboard sessions of one server (in memory: a restarted server asks everyone to log in again)."""

    def __init__(self, seconds: float = SESSION_SECONDS) -> None:
        self.seconds = seconds
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, who: Principal, replacing: str | None = None) -> Session:
        """A new session for ``who`` (a new id every time: no id a browser brought is ever adopted), ending
        ``replacing`` (the session this browser had, if any) and, past ``SESSIONS_PER_PRINCIPAL``, ``who``'s own
        oldest. ``SessionsFull`` when live sessions fill the server: logins of one principal never evict
        another's."""
        session = Session(secrets.token_urlsafe(32), who, secrets.token_urlsafe(32), time.time() + self.seconds)
        with self._lock:
            now = time.time()
            self._by_id = {k: v for k, v in self._by_id.items() if v.expires > now and k != replacing}
            own = [k for k, v in self._by_id.items() if v.who == who]  # oldest first (insertion order)
            for sid in own[: max(0, len(own) - SESSIONS_PER_PRINCIPAL + 1)]:
                del self._by_id[sid]
            if len(self._by_id) >= MAX_SESSIONS:
                raise SessionsFull
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


class LoginThrottle:
    """Sliding-window counts of wrong tokens per address and of logins per principal.

    A token is long and random, so guessing one is hopeless, but a form that answers as fast as it is asked
    invites trying (and a client's token is only 16 characters at least); and a principal that logs in in a loop
    churns sessions. Each key keeps the times of its events within the window; a full window answers 429 with
    ``Retry-After`` (when its oldest event leaves it). Memory is bounded: at most ``THROTTLE_KEYS`` keys per kind.
    """

    def __init__(
        self,
        window: float = LOGIN_WINDOW_SECONDS,
        failures_per_address: int = LOGIN_FAILURES_PER_ADDRESS,
        logins_per_principal: int = LOGINS_PER_PRINCIPAL,
    ) -> None:
        self.window = window
        self.limits = {"address": failures_per_address, "principal": logins_per_principal}
        self._events: dict[str, OrderedDict[str, deque[float]]] = {"address": OrderedDict(), "principal": OrderedDict()}
        self._lock = threading.Lock()

    def wait(self, kind: str, key: str) -> int:
        """Seconds until ``key`` may try again (0: now)."""
        with self._lock:
            times = self._recent(kind, key)
            if times is None or len(times) < self.limits[kind]:
                return 0
            return max(1, math.ceil(times[0] + self.window - time.monotonic()))

    def note(self, kind: str, key: str) -> None:
        """One more event (a wrong token from an address, a login of a principal)."""
        with self._lock:
            times = self._recent(kind, key)
            if times is None:
                events = self._events[kind]
                while len(events) >= THROTTLE_KEYS:
                    events.popitem(last=False)
                times = events[key] = deque()
            times.append(time.monotonic())
            self._events[kind].move_to_end(key)
            while len(times) > self.limits[kind]:
                times.popleft()

    def _recent(self, kind: str, key: str) -> deque[float] | None:
        times = self._events[kind].get(key)
        if times is not None:
            horizon = time.monotonic() - self.window
            while times and times[0] <= horizon:
                times.popleft()
        return times


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

    def __init__(self, sessions: Sessions, throttle: LoginThrottle | None = None) -> None:
        self.sessions = sessions
        self.throttle = throttle or LoginThrottle()

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
        """The live view's socket, before it is accepted: a session, from this origin (its CSRF token comes in
        its first message: ``socket_hello``)."""
        session = self.session(ws)
        if session is None or not same_origin(ws):
            return None
        return session

    async def socket_hello(self, ws: WebSocket, session: Session) -> bool:
        """The accepted socket's first message is ``{"op": "hello", "csrf": TOKEN}`` with the session's token,
        within ``SOCKET_HELLO_SECONDS``; nothing is sent on the socket before it."""
        try:
            first = json.loads(await asyncio.wait_for(ws.receive_text(), SOCKET_HELLO_SECONDS))
        except (TimeoutError, ValueError, KeyError, WebSocketDisconnect):  # late, not JSON text, or gone
            return False
        given = first.get("csrf") if isinstance(first, dict) and first.get("op") == "hello" else None
        return csrf_ok(given if isinstance(given, str) else None, session.csrf)
