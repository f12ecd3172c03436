"""Who is calling, decided in one place: every route, the gateway's fast path and the dashboard ask here.

A caller is a ``Principal``: the **operator** (the server's own token, ``--token-file``: may do everything),
a **client** (a tenant named in ``--clients-file``: sees and touches only its own replicas, leases and
episodes), or an **OSGym caller by address** (``--osgym-allow``; OSGym clients send no token), a principal of
its own named ``ip:<address>``. ``/health`` is open (up or down; more with a token); ``/metrics`` needs the
operator's token or the metrics token (``require_metrics_reader``), from loopback too.

The gateway reaches its hosts with their operator token and names the client it acts for in
``X-Osfleet-Client``, and itself in ``X-Osfleet-Gateway``; a host honours them only from the operator's token, and
the gateway (the edge) never honours them at all, so nothing a client sends can claim another client's identity.
On a host, a client a gateway names is ``<gateway>/<client>``: the same name through two gateways, or a gateway's
client and a client of the host's own file, are different principals (their names come from different
authorities), never one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, status
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from osfleet.api.errors import Forbidden
from osfleet.api.probes import PATHS as PROBES
from osfleet.cli_support import load_or_create_token as load_or_create_token  # the token file, kept by the CLI
from osfleet.config import AgentConfig, ClientToken
from osfleet.errors import ConfigError

ON_BEHALF_OF = "X-Osfleet-Client"
VOUCHED_BY = "X-Osfleet-Gateway"  # the gateway that names the client: a namespace of client names on a host
OPERATOR = "operator"
CLIENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# What the gateway may name on a host: a client, or an OSGym caller it let in by address.
ACTING_FOR = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,63}|ip:[0-9A-Za-z.:%-]{1,64})$")
MIN_TOKEN_CHARS = 16
# OSGym's endpoints, where an allow-listed address stands in for a token (``require_principal_or_osgym_ip``).
OSGYM_PATHS = frozenset({"/reset", "/step", "/shutdown", "/screenshot"})
# What anyone may ask without a token; the dashboard (``/ui``) checks its sessions itself, and reads its small
# bodies (login 4 KiB) only after that or under their own limit.
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}) | PROBES


@dataclass(frozen=True)
class Principal:
    """Who a request is from. ``name`` is what leases, OSGym vms and recorded episodes are owned by."""

    name: str
    operator: bool = False

    @property
    def owner(self) -> str | None:
        """The owner a claim must match: None for the operator (everything is theirs to touch)."""
        return None if self.operator else self.name

    def owns(self, owner: str) -> bool:
        return self.operator or owner == self.name


OPERATOR_PRINCIPAL = Principal(OPERATOR, operator=True)


# --- tokens ---------------------------------------------------------------------------------------------------
def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def load_clients(path: Path, operator_token: str | None = None) -> tuple[ClientToken, ...]:
    """A clients file: one ``NAME TOKEN`` per line (TOKEN may be ``sha256:<64 hex digits>``); ``#`` comments
    and blank lines are skipped. A bad line is a ``ConfigError`` naming the file and the line."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read clients file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    clients: list[ClientToken] = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue

        def bad(why: str, number: int = number) -> ConfigError:
            return ConfigError(f"clients file {path} line {number}: {why}")

        parts = line.split()
        if len(parts) != 2:
            raise bad("expected NAME TOKEN (two fields separated by spaces)")
        name, token = parts
        if not CLIENT_NAME.match(name):
            raise bad(f"client name {name[:40]!r} must be letters, digits, '.', '_' or '-' (at most 64)")
        if name == OPERATOR:
            raise bad(f"{OPERATOR!r} is the operator (the --token-file token), not a client name")
        if token.startswith("sha256:"):
            hexdigest = token.removeprefix("sha256:")
            if not re.fullmatch(r"[0-9a-fA-F]{64}", hexdigest):
                raise bad("a sha256: token needs exactly 64 hex digits")
            sha = bytes.fromhex(hexdigest)
        else:
            if len(token) < MIN_TOKEN_CHARS:
                raise bad(f"client {name}'s token is shorter than {MIN_TOKEN_CHARS} characters")
            sha = digest(token)
        if operator_token is not None and hmac.compare_digest(sha, digest(operator_token)):
            raise bad(f"client {name}'s token is the operator's token")
        if any(c.name == name for c in clients):
            raise bad(f"client {name} is named twice")
        if any(hmac.compare_digest(c.sha256, sha) for c in clients):
            raise bad(f"client {name}'s token is another client's too")
        clients.append(ClientToken(name, sha))
    return tuple(clients)


# --- who is calling -------------------------------------------------------------------------------------------
def _bearer(conn: HTTPConnection) -> str | None:
    scheme, _, value = conn.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _config(conn: HTTPConnection) -> AgentConfig:
    config: AgentConfig = conn.app.state.config
    return config


def principal_of_token(config: AgentConfig, token: str) -> Principal | None:
    """The principal a bearer token names, compared in constant time against every known token."""
    if hmac.compare_digest(token.encode(), config.token.encode()):
        return OPERATOR_PRINCIPAL
    sha = digest(token)
    found = None
    for client in config.clients:  # every digest is compared: the time taken does not say which matched
        if hmac.compare_digest(client.sha256, sha):
            found = client.name
    return Principal(found) if found is not None else None


_KNOWN = "osfleet.principal"  # the request's principal, once found (the middlewares and the route ask in turn)


def authenticate(conn: HTTPConnection) -> Principal | None:
    """The request's principal from its bearer token (None without a valid one). The operator's token may
    name the client it acts for (the gateway does) where the server trusts that (``on_behalf_of``). Found once
    per request: the answer is kept in its scope for the next to ask."""
    if _KNOWN in conn.scope:
        known: Principal | None = conn.scope[_KNOWN]
        return known
    who = _authenticate(conn)
    conn.scope[_KNOWN] = who
    return who


def _authenticate(conn: HTTPConnection) -> Principal | None:
    token = _bearer(conn)
    if token is None:
        return None
    config = _config(conn)
    who = principal_of_token(config, token)
    if who is not None and who.operator and config.on_behalf_of:
        acting_for = conn.headers.get(ON_BEHALF_OF)
        if acting_for is not None:
            if not ACTING_FOR.match(acting_for) or acting_for == OPERATOR:
                raise _unauthorized(f"{ON_BEHALF_OF} must name a client (letters, digits, '.', '_', '-')")
            gateway = conn.headers.get(VOUCHED_BY)
            if gateway is None or not CLIENT_NAME.match(gateway):
                raise _unauthorized(f"{ON_BEHALF_OF} needs {VOUCHED_BY} naming the gateway that vouches for the client")
            return Principal(f"{gateway}/{acting_for}")
    return who


def gateway_id(token: str) -> str:
    """The name a gateway gives itself on its hosts (``X-Osfleet-Gateway``): derived from its own operator token,
    so every replica of one gateway (they share the token) is one namespace and two gateways are two, with no
    setting to get wrong; it says nothing about the token (an HMAC of a fixed text under it)."""
    return "gw-" + hmac.new(token.encode(), b"osfleet gateway id", hashlib.sha256).hexdigest()[:12]


def principal_if_any(conn: HTTPConnection) -> Principal | None:
    """The caller where a token is optional (``/health``): a missing, wrong or malformed credential is no one."""
    try:
        return authenticate(conn)
    except HTTPException:
        return None


def _unauthorized(detail: str = "missing or wrong bearer token") -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def client_address(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client else ""


# FastAPI dependencies. Coroutines on purpose: a plain function would be run in the shared thread pool, a
# hand-over to a worker thread and back on every request (and a wait for one when steps hold them all).
async def require_principal(request: HTTPConnection) -> Principal:
    who = authenticate(request)
    if who is None:
        raise _unauthorized()
    return who


async def require_operator(request: HTTPConnection) -> Principal:
    who = await require_principal(request)
    if not who.operator:
        raise Forbidden("this needs the operator's token")
    return who


async def require_principal_or_osgym_ip(request: HTTPConnection) -> Principal:
    """OSGym's endpoints: a bearer token, or an address in the OSGym allow-list (principal ``ip:<address>``)."""
    who = authenticate(request) or osgym_address_principal(request)
    if who is not None:
        return who
    raise _unauthorized("send a bearer token, or call from an address in the OSGym allow-list")


def osgym_address_principal(conn: HTTPConnection) -> Principal | None:
    """An OSGym caller known by its address alone (in ``--osgym-allow``): principal ``ip:<address>``, else None."""
    address = client_address(conn)
    if address and address in _config(conn).osgym_allowed_ips:
        return Principal(f"ip:{address}")
    return None


def foreign_origin(conn: HTTPConnection) -> str | None:
    """The request's ``Origin`` when a browser sent it from a page of another site than this server (its scheme,
    host and port are not the ``Host`` it was sent to), else None. Programs send no ``Origin``."""
    origin = conn.headers.get("origin")
    if origin is None:
        return None
    host = conn.headers.get("host", "")
    if host and origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower()):
        return None
    return origin


async def require_metrics_reader(request: HTTPConnection) -> None:
    """``/metrics``: a browser page of another site is refused (403) whatever it sends; then the operator's token or
    the metrics token (``--metrics-token-file``: one that reads ``/metrics`` and nothing else), from loopback too. A
    page of any site, or another user of the machine, must not learn how busy the host is and who it serves."""
    origin = foreign_origin(request)
    if origin is not None:
        raise Forbidden(f"Origin {origin[:100]} is not this server's: /metrics is not for other sites' pages")
    token = _bearer(request)
    reader = _config(request).metrics_token
    if token is not None and reader is not None and hmac.compare_digest(token.encode(), reader.encode()):
        return
    await require_operator(request)


class AuthBeforeBody:
    """ASGI middleware: a request with a body is authenticated from its headers before a byte of the body is
    read, and refused 401 unread when it would be refused anyway.

    FastAPI reads and parses a route's body before it runs the route's dependencies (where ``require_principal``
    lives), so without this anyone who reached the port could make the server take in ``--max-body-mib`` (16
    MiB) per request before being told to authenticate. Inside ``BodyLimit`` (which answers an oversized one
    first) and in front of everything else, the gateway's step fast path included. The refusal is the route's
    own (same status, body and ``WWW-Authenticate``); a request without a body goes on, for its route to answer.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope) or _open(scope["path"]):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        try:
            known = authenticate(conn) is not None
            detail = "missing or wrong bearer token"
        except HTTPException as exc:  # a malformed X-Osfleet-Client: the route's own words
            known, detail = False, str(exc.detail)
        if not known and scope["path"] in OSGYM_PATHS:
            known = osgym_address_principal(conn) is not None
            detail = "send a bearer token, or call from an address in the OSGym allow-list"
        if known:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": detail, "kind": "unauthorized"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                    (b"connection", b"close"),  # the body is never read: the connection ends with the answer
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.strip() not in (b"", b"0")
        if name == b"transfer-encoding":
            return True
    return False


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path == "/ui" or path.startswith("/ui/")


Caller = Annotated[Principal, Depends(require_principal)]
Operator = Annotated[Principal, Depends(require_operator)]
OsgymCaller = Annotated[Principal, Depends(require_principal_or_osgym_ip)]
