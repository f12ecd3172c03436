"""What every operation can answer besides success, in one place, so the published OpenAPI is the truth.

Each route lists its error statuses with ``errors(...)``; the bodies are ``ErrorBody`` everywhere (the
handlers in errors.py make them). ``BoundaryRoute`` is the last line of defence: an exception that is not
one of osfleet's own becomes an ``InternalError`` (503, kind infrastructure) instead of a bare 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from osfleet.api import auth
from osfleet.errors import OsfleetError, as_osfleet


class ErrorBody(BaseModel):
    """Every error: one readable line, and a kind a client can branch on."""

    error: str = Field(description="what went wrong, in one line")
    kind: str = Field(
        description="unauthorized | forbidden | not_found | too_large | lease | busy | conflict | invalid_request | "
        "invalid_action | invalid_task | capacity | infrastructure"
    )
    detail: list[dict[str, Any]] | None = Field(None, description="for invalid_request: every problem found")


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}
WHY = {
    401: "missing or wrong bearer token",
    403: "the operator's token is needed: scale-up, /v1/host, replicas of the warm pool, or a shell as_root "
    "(unless the host runs with --allow-agent-root)",
    404: "unknown replica, task or vm id, or one that is another client's (not confirmed to exist)",
    409: "the lease is expired, released or does not hold the replica, or the replica is busy",
    413: "the request body is over the server's limit (refused before it is read)",
    422: "malformed request, action or task (the problem is named)",
    503: "no capacity right now, or the replica or guest failed (kind: infrastructure, never a reward of 0)",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that can answer with ``codes``."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        doc: dict[str, Any] = {"model": ErrorBody, "description": WHY[code]}
        if code == 503:
            doc["headers"] = RETRY_AFTER
        if code == 401:
            doc["headers"] = {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}
        out[code] = doc
    return out


class BoundaryRoute(APIRoute):
    """A route whose unexpected exceptions become osfleet errors (503 infrastructure), logged once."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (OsfleetError, HTTPException, RequestValidationError):
                raise
            except Exception as exc:
                raise as_osfleet(exc, f"{request.method} {request.url.path}") from exc

        return guarded


PROMETHEUS = "text/plain; version=0.0.4"


def add_metrics_route(app: FastAPI, render: Callable[[], Awaitable[bytes]]) -> None:
    """``GET /metrics`` in Prometheus's text format: open to loopback, the operator's token elsewhere.
    ``render`` is awaited on the event loop: it must hand any blocking work to a thread of its own."""

    @app.get(
        "/metrics",
        tags=["meta"],
        dependencies=[Depends(auth.require_loopback_or_token)],
        response_class=Response,
        responses={
            200: {"content": {PROMETHEUS: {"schema": {"type": "string"}}}, "description": "Prometheus text format"},
            **errors(401, 403),
        },
    )
    async def metrics() -> Response:
        """Prometheus text format; open to loopback, the operator's token elsewhere."""
        return Response(await render(), media_type=PROMETHEUS)
