"""The streamable HTTP transport of ``osfleet mcp serve``: a bearer token in front of the SDK's own app.

Why a token at all: whoever reaches the port drives a desktop and runs commands on it. The SDK checks ``Host`` and
``Origin`` (a web page in a browser must not reach a server on the loopback, DNS rebinding); this adds the token,
compared in constant time, before anything of the request is read (401 with ``WWW-Authenticate: Bearer``).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send


class BearerToken:
    """ASGI middleware: HTTP requests without ``Authorization: Bearer <token>`` are answered 401 unread."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(scope):
            body = json.dumps({"error": "missing or wrong bearer token", "kind": "unauthorized"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b"Bearer"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)
        return False
