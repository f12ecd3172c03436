"""A step's plain case served without FastAPI's routing and dependency machinery.

``POST /v1/replicas/{rid}/step`` is the call an agent makes many times an episode, and on a busy 2-core host
every fraction of a millisecond the gateway spends on it is latency. This middleware answers it when nothing
about it is unusual, with the route's own parts: the caller is who ``osfleet.api.auth.authenticate`` says (the
function behind the route's dependency), the body parses and validates as ``StepRequest`` (the same pydantic
model, validated the same way as the route does), and the step goes to ``Gateway.step``, the function the route
calls, whose errors the app's own handler answers. Anything else (no valid token, a body that is not JSON or
not a valid step) is handed to the documented route with the body it came with, so every refusal is the
route's own answer. Bodies are bounded before they get here (``BodyLimit``, outermost).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osfleet.api import auth
from osfleet.api.auth import Principal
from osfleet.api.models import StepRequest
from osfleet.errors import OsfleetError, as_osfleet

if TYPE_CHECKING:
    from osfleet.fleet.gateway import Gateway

STEP_PATH = re.compile(r"^/v1/replicas/([^/]+)/step$")


class StepFastPath:
    """ASGI middleware in front of the gateway's routes (``app.add_middleware(StepFastPath, gw=...)``)."""

    def __init__(self, app: ASGIApp, gw: Callable[[], Gateway]) -> None:
        self.app = app
        self.gw = gw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = STEP_PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        body, extra = await _read_body(receive)
        plain = None if extra else self._plain(scope, body)
        if plain is None:
            await self.app(scope, _replay(body, extra, receive), send)
            return
        who, req = plain
        try:
            response = await self.gw().step(match.group(1), req, who)
        except OsfleetError as exc:
            response = await _error(scope, exc)
        except Exception as exc:  # the route's BoundaryRoute does the same: never a bare 500
            response = await _error(scope, as_osfleet(exc, f"POST {scope['path']}"))
        await response(scope, receive, send)

    def _plain(self, scope: Scope, body: bytes) -> tuple[Principal, StepRequest] | None:
        """(the caller, the validated request) when the route would accept them as they are; None otherwise."""
        request = Request(scope)
        try:
            who = auth.authenticate(request)
        except HTTPException:
            return None
        if who is None:
            return None
        content_type = request.headers.get("content-type", "")
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            return None
        try:
            return who, StepRequest.model_validate(json.loads(body))
        except (ValueError, RecursionError, ValidationError):  # the route names what is wrong
            return None


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    """The request's body, and any messages that were not part of it (a disconnect)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), [message]
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), []


def _replay(body: bytes, extra: list[Message], receive: Receive) -> Receive:
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}, *extra]

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


async def _error(scope: Scope, exc: OsfleetError) -> Any:
    handler = scope["app"].exception_handlers[OsfleetError]  # errors.install's, as for the route
    return await handler(Request(scope), exc)
