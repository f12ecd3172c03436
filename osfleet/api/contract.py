"""What every operation can answer besides success, in one place, so the published OpenAPI is the truth.

Each route lists its error statuses with ``errors(...)``; the bodies are ``ErrorBody`` everywhere (the
handlers in errors.py make them). ``BoundaryRoute`` is the last line of defence: an exception that is not
one of osfleet's own becomes an ``InternalError`` (503, kind infrastructure) instead of a bare 500.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
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
        description="unauthorized | not_found | lease | busy | conflict | invalid_request | invalid_action | "
        "invalid_task | capacity | infrastructure"
    )
    detail: list[dict[str, Any]] | None = Field(None, description="for invalid_request: every problem found")


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}
WHY = {
    401: "missing or wrong bearer token",
    404: "unknown replica, task or vm id",
    409: "the lease is expired, released or someone else's, or the replica is busy",
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


def add_metrics_route(app: FastAPI, render: Callable[[], bytes]) -> None:
    """``GET /metrics`` in Prometheus's text format: open to loopback, a bearer token elsewhere."""

    @app.get(
        "/metrics",
        tags=["meta"],
        dependencies=[Depends(auth.require_loopback_or_token)],
        response_class=Response,
        responses={
            200: {"content": {PROMETHEUS: {"schema": {"type": "string"}}}, "description": "Prometheus text format"},
            **errors(401),
        },
    )
    def metrics() -> Response:
        """Prometheus text format; open to loopback, a bearer token elsewhere."""
        return Response(render(), media_type=PROMETHEUS)
