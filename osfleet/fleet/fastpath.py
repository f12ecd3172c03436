"""A step's plain case served without FastAPI's routing and dependency machinery.

``POST /v1/replicas/{rid}/step`` is the call an agent makes many times an episode, and on a busy 2-core host
every fraction of a millisecond the gateway spends on it is latency. This middleware answers it when nothing
about it is unusual, with the route's own parts: the caller is who ``osfleet.api.auth.authenticate`` says (the
function behind the route's dependency), the body parses and validates as ``StepRequest`` (the same pydantic
model, validated the same way as the route does), and the step goes to ``Gateway.step``, the function the route
calls, whose errors the app's own handler answers. Anything else (no valid token, a body that is not JSON or
not a valid step) is handed to the documented route with the body it came with, so every refusal is the
route's own answer. The caller is known before the body is read: a body from no one is never read here (and
``auth.AuthBeforeBody``, in front, refuses it 401 unread); bodies are bounded before that (``BodyLimit``,
outermost).
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
    """ASGI middleware in front of the gateway's routes (``app.add_middleware(StepFastPath, get_gateway=...)``)."""

    def __init__(self, app: ASGIApp, get_gateway: Callable[[], Gateway]) -> None:
        self.app = app
        self.get_gateway = get_gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = STEP_PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        who = _caller(scope)
        if who is None:  # the route refuses it (a body from a stranger was refused unread by AuthBeforeBody)
            await self.app(scope, receive, send)
            return
        body, extra = await _read_body(receive)
        req = None if extra else _valid_step_request(scope, body)
        if req is None:
            await self.app(scope, _replay(body, extra, receive), send)
            return
        try:
            response = await self.get_gateway().step(match.group(1), req, who)
        except OsfleetError as exc:
            response = await _error(scope, exc)
        except Exception as exc:  # the route's BoundaryRoute does the same: never a bare 500
            response = await _error(scope, as_osfleet(exc, f"POST {scope['path']}"))
        await response(scope, receive, send)


def _caller(scope: Scope) -> Principal | None:
    """Who the route's dependency would say is calling, from the headers alone (before any body is read)."""
    try:
        return auth.authenticate(Request(scope))
    except HTTPException:
        return None


def _valid_step_request(scope: Scope, body: bytes) -> StepRequest | None:
    """The validated request when the route would accept it as it is; None otherwise (the route says why)."""
    content_type = Request(scope).headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        return None
    try:
        return StepRequest.model_validate(json.loads(body))
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
