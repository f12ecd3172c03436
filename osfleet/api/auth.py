"""Authentication in one place: a bearer token for every endpoint; OSGym's endpoints also accept a
configured client IP allow-list (OSGym clients send no token). /health is open; /metrics is open to
loopback only."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from pathlib import Path

from fastapi import HTTPException, Request, status


def load_or_create_token(path: Path) -> str:
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return token


def _bearer_ok(request: Request) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    expected: str = request.app.state.config.token
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), expected.encode())


def _client(request: Request) -> str:
    return request.client.host if request.client else ""


def require_token(request: Request) -> None:
    if not _bearer_ok(request):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_token_or_osgym_ip(request: Request) -> None:
    if _bearer_ok(request) or _client(request) in request.app.state.config.osgym_allowed_ips:
        return
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail="send a bearer token, or call from an address in the OSGym allow-list",
        headers={"WWW-Authenticate": "Bearer"},
    )


def require_loopback_or_token(request: Request) -> None:
    try:
        if ipaddress.ip_address(_client(request)).is_loopback:
            return
    except ValueError:
        pass
    require_token(request)


ON_BEHALF_OF = "X-Osfleet-Client"


def caller(request: Request) -> str:
    """Who is calling, for OSGym's per-caller replica ownership.

    A caller with the token (the fleet gateway) may name the client it acts for; a client reached only
    through the IP allow-list cannot.
    """
    if _bearer_ok(request):
        client = request.headers.get(ON_BEHALF_OF)
        return f"via:{client[:200]}" if client else f"token:{_client(request)}"
    return f"ip:{_client(request)}"
