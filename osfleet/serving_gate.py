"""Who may use a server osfleet puts in front of a fleet (``osfleet openenv serve``, ``osfleet mcp serve``).

Such a server holds a fleet token and spends it for whoever reaches its port: a session drives a desktop and runs
commands on it. So every HTTP request and WebSocket handshake passes this gate before the app reads anything:

- **A token of the server's own** (never the fleet token it forwards with): ``Authorization: Bearer <token>``, or
  HTTP Basic with the token as password, which is what clients send for a URL with credentials in it
  (``http://osfleet:<token>@host:port``): OpenEnv's ``EnvClient`` sends no header of its own, but its WebSocket
  library turns such a URL into that header, so OpenEnv's client works unchanged and the token never travels in a
  path or query string (nor in any access log).
- **Same-user peers on loopback**, when the server allows them (OpenEnv): a connection from this machine's loopback
  whose socket belongs to the server's own user (read from ``/proc/net/tcp``, as ``identd`` and PostgreSQL's
  ``peer`` authentication do) needs no token: that process could read the token file anyway. Another user of the
  machine, a container with a forwarded port or any remote address still needs the token.
- **Origin**: a request that carries an ``Origin`` header comes from a browser; it must be one of the allowed
  origins (default: the server's own, ``http://127.0.0.1:<its port>``; a page served on another port of the same
  machine is another site), else 403, so a web page cannot drive a desktop through a browser that happens to run
  beside the server (DNS rebinding included). Programs send no ``Origin`` and are not affected.

A refusal is 401 (with ``WWW-Authenticate``) or 403 and a JSON reason, and for a WebSocket the handshake is refused
the same way: nothing of the session starts.

A server with two surfaces (an agent's and a grader's, ``osfleet.mcp.roles``) puts a gate with its own token in
front of each path (``Surfaces``): the agent's token never opens the grader's surface.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hmac
import json
import os
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from osfleet.peers import loopback_peer_uid

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def own_origins(port: int) -> tuple[str, ...]:
    """The origins of a loopback server's own pages (the default allowed): another port is another site."""
    return tuple(f"http://{name}:{port}" for name in LOOPBACK_NAMES)


class ServingGate:
    """ASGI middleware in front of a served app: the token, same-user loopback peers (if allowed) and Origin."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        same_user_peers: bool = False,
        origins: Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self._token = token.encode()
        self.same_user_peers = same_user_peers
        self.origins = tuple(origins) if origins is not None else None  # None: the server's own origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", ())}
        origin = headers.get(b"origin")
        port = int(scope["server"][1]) if scope.get("server") else 0
        if origin is not None and not self.origin_allowed(origin.decode("latin-1"), port):
            await _refuse(scope, send, 403, f"Origin {origin.decode('latin-1')[:100]} is not allowed", "forbidden")
            return
        if not (self.token_given(headers.get(b"authorization")) or self._same_user_peer(scope)):
            await _refuse(scope, send, 401, "missing or wrong token", "unauthorized")
            return
        await self.app(scope, receive, send)

    def origin_allowed(self, origin: str, port: int) -> bool:
        """``origin`` is one of ``--allow-origin``'s patterns, or (by default) a page of this very server."""
        allowed = self.origins if self.origins is not None else own_origins(port)
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in allowed)

    def token_given(self, authorization: bytes | None) -> bool:
        """``Bearer <token>``, or Basic with the token as password (any user name)."""
        if not authorization:
            return False
        scheme, _, given = authorization.partition(b" ")
        given = given.strip()
        if scheme.lower() == b"bearer":
            return hmac.compare_digest(given, self._token)
        if scheme.lower() == b"basic":
            try:
                _, _, password = base64.b64decode(given, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(password, self._token)
        return False

    def _same_user_peer(self, scope: Scope) -> bool:
        if not self.same_user_peers or not scope.get("client") or not scope.get("server"):
            return False
        return loopback_peer_uid(tuple(scope["client"]), tuple(scope["server"])) == os.geteuid()


async def _refuse(scope: Scope, send: Send, status: int, reason: str, kind: str) -> None:
    body = json.dumps({"error": reason, "kind": kind}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer, Basic realm="osfleet"'))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in scope.get("extensions", {}):  # the handshake answered with this response
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # a server without that extension refuses a handshake closed before it is accepted (403)
        await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})


class Surfaces:
    """Requests (and WebSocket handshakes) to a path under one of ``prefixed``'s prefixes go to that gate, all
    others (and the lifespan) to ``default``: one server, each surface behind its own token."""

    def __init__(self, default: ASGIApp, prefixed: dict[str, ASGIApp]) -> None:
        self.default = default
        self.prefixed = prefixed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path = scope.get("path", "")
            for prefix, app in self.prefixed.items():
                if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                    await app(scope, receive, send)
                    return
        await self.default(scope, receive, send)
