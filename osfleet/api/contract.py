"""How an operation of the table (``osfleet.api.operations``) becomes a route, the same way on the host agent and
the gateway, so the published OpenAPI is the truth on both.

``Routes`` mounts a server's handler for each operation with everything the table says (path, method, status,
answer model, error statuses and their ``ErrorBody``, who may call it, its description) and checks the handler
against it: its path parameters, its body or query model and its caller must be the operation's, and nothing
else may be declared, so a handler cannot publish a parameter the table does not have. A file's bytes travel as
they are (``application/octet-stream``): an operation with ``raw_body`` takes them as a ``RawBody`` parameter (read
whole, bounded by the server's ``BodyLimit``: 413 past it), one with ``raw_response`` answers an ``OctetStream``,
and both are published so (a binary request body, a binary answer), not as JSON. ``complete()`` refuses
a server that leaves an operation out. ``BoundaryRoute`` is the last line of defence: an exception that is not
one of osfleet's own becomes an ``InternalError`` (503, kind infrastructure) instead of a bare 500.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from osfleet.api import auth
from osfleet.api.operations import Auth, Operation
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.protocol.errors import WHY, ErrorBody

RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that can answer with ``codes``."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        doc: dict[str, Any] = {"model": ErrorBody, "description": WHY[code]}
        if code in (429, 503):
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


CALLERS: dict[Auth, Any] = {"caller": auth.Caller, "operator": auth.Operator, "osgym": auth.OsgymCaller}
EVERY_ROUTE_MAY_ANSWER = (401, 413, 422, 429)  # 429: the caller's share of the host in use (api.admission)
Endpoint = Callable[..., Any]
OCTET_STREAM = "application/octet-stream"
BINARY = {"type": "string", "format": "binary"}
ERROR_BODY_REF = {"$ref": "#/components/schemas/ErrorBody"}  # published by every other operation's errors


async def _raw_body(request: Request) -> bytes:
    """The request's body as it came, whatever its content type says (the server's ``BodyLimit`` middleware has
    bounded it: past the limit this raises its 413)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(_raw_body)]
"""A handler's parameter for the bytes of an operation with ``raw_body``."""


class OctetStream(Response):
    """The answer of an operation with ``raw_response``: bytes as they are."""

    media_type = OCTET_STREAM


class Routes:
    """One server's handlers for the operations of the table, mounted as the table says."""

    def __init__(self, operations: Sequence[Operation]) -> None:
        self.operations = tuple(operations)
        self.router = APIRouter(route_class=BoundaryRoute)
        self.bound: dict[str, Endpoint] = {}

    def __call__(self, op: Operation) -> Callable[[Endpoint], Endpoint]:
        """``@routes(RESET)`` above a handler: mounts it for that operation."""

        def mount(endpoint: Endpoint) -> Endpoint:
            self.mount(op, endpoint)
            return endpoint

        return mount

    def mount(self, op: Operation, endpoint: Endpoint) -> None:
        if op not in self.operations:
            raise RuntimeError(f"{op.name} is not one of this server's operations")
        if op.name in self.bound:
            raise RuntimeError(f"{op.name} has two handlers")
        check_handler(op, endpoint)
        self.bound[op.name] = endpoint
        responses = errors(*sorted({*EVERY_ROUTE_MAY_ANSWER, *op.errors}))
        extra: dict[str, Any] = {}
        if op.raw_response:
            # FastAPI files every answer of a route under the route's media type: its errors stay JSON here
            for code, doc in list(responses.items()):
                if "model" in doc:
                    json_doc = {k: v for k, v in doc.items() if k != "model"}
                    responses[code] = {**json_doc, "content": {"application/json": {"schema": ERROR_BODY_REF}}}
            responses[op.status] = {"description": "the file's bytes", "content": {OCTET_STREAM: {"schema": BINARY}}}
            extra["response_class"] = OctetStream
        if op.raw_body:
            body = {"required": True, "content": {OCTET_STREAM: {"schema": BINARY}}}
            extra["openapi_extra"] = {"requestBody": {**body, "description": "the file's bytes"}}
        self.router.add_api_route(
            op.path,
            endpoint,
            methods=[op.method],
            status_code=op.status,
            response_model=op.response,
            responses=responses,
            **extra,
            dependencies=[Depends(CALLERS[op.auth].__metadata__[0].dependency)],
            tags=[op.tag],
            summary=op.summary,
            description=op.doc,
            operation_id=op.name,
        )

    def complete(self) -> APIRouter:
        """The router, once every operation has its handler (a server that leaves one out does not start)."""
        missing = [op.name for op in self.operations if op.name not in self.bound]
        if missing:
            raise RuntimeError("operations without a handler: " + ", ".join(missing))
        return self.router


def check_handler(op: Operation, endpoint: Endpoint) -> None:
    """Refuse a handler whose parameters are not the operation's: its path parameters (text), its body or query
    model (``RawBody`` for a raw body), its caller, and the request or response objects; nothing else."""
    hints = typing.get_type_hints(endpoint, include_extras=True)
    expected: dict[str, Any] = {name: str for name in op.path_params}
    seen: set[str] = set()
    for name, param in inspect.signature(endpoint).parameters.items():
        hint = hints.get(name, param.annotation)
        problem = _parameter_problem(op, name, hint, expected)
        if problem:
            raise RuntimeError(f"{op.name} handler {endpoint.__qualname__}: parameter {name} {problem}")
        seen.add(_role(op, name, hint))
    body = ["body"] if op.body or op.raw_body else []
    wanted = {*op.path_params, "caller", *body, *(["query"] if op.query else [])}
    if wanted - seen:
        raise RuntimeError(f"{op.name} handler {endpoint.__qualname__} lacks: {', '.join(sorted(wanted - seen))}")


def _role(op: Operation, name: str, hint: Any) -> str:
    if name in op.path_params:
        return name
    if hint == CALLERS[op.auth]:
        return "caller"
    if op.body is not None and hint is op.body:
        return "body"
    if op.raw_body and hint == RawBody:
        return "body"
    if op.query is not None and typing.get_origin(hint) is typing.Annotated and hint.__origin__ is op.query:
        return "query"
    return "plumbing"


def _parameter_problem(op: Operation, name: str, hint: Any, expected: dict[str, Any]) -> str | None:
    if name in expected:
        return None if hint is expected[name] else f"is a path parameter: must be {expected[name].__name__}"
    role = _role(op, name, hint)
    if role == "query":
        meta = hint.__metadata__
        return None if len(meta) == 1 and type(meta[0]) is type(Query()) else "must be Annotated[model, Query()]"
    if role in ("caller", "body"):
        return None
    if inspect.isclass(hint) and issubclass(hint, Request | Response):
        return None
    return f"({hint!r}) is not in the operation's table entry (osfleet.api.operations)"


PROMETHEUS = "text/plain; version=0.0.4"


def add_metrics_route(app: FastAPI, render: Callable[[], Awaitable[bytes]]) -> None:
    """``GET /metrics`` in Prometheus's text format, for the operator's token or the metrics token (a foreign
    ``Origin`` refused first: ``auth.require_metrics_reader``).
    ``render`` is awaited on the event loop: it must hand any blocking work to a thread of its own."""

    @app.get(
        "/metrics",
        tags=["meta"],
        dependencies=[Depends(auth.require_metrics_reader)],
        response_class=Response,
        responses={
            200: {"content": {PROMETHEUS: {"schema": {"type": "string"}}}, "description": "Prometheus text format"},
            **errors(401, 403),
        },
    )
    async def metrics() -> Response:
        """Prometheus text format; the operator's token or the metrics token (``--metrics-token-file``), from
        loopback too; a browser page of another site is refused."""
        return Response(await render(), media_type=PROMETHEUS)
