"""Errors -> HTTP, in one place: each of the server's errors has a kind, each kind its status (the protocol's one
table, ``osfleet.protocol.errors``), and every answer a JSON reason.

Client mistakes are 4xx; failures of the infrastructure (a replica's QEMU or guest agent, a set-up that
cannot run) are 503 with ``"kind": "infrastructure"``, so a trainer never mistakes them for reward 0.
"""

from __future__ import annotations

import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from osfleet.api.osgym_actions import ActionStringError
from osfleet.errors import GuestFileTooLargeError, GuestTimeoutError, ImageNotFoundError, OsfleetError, VirtError
from osfleet.protocol.errors import STATUS, USUAL_KIND, ErrorKind, kind_of
from osfleet.replicas.checkpoints import (
    CheckpointExistsError,
    CheckpointNameError,
    CheckpointNotFoundError,
    CheckpointQuotaError,
    CheckpointSavesPendingError,
    CheckpointTooLargeError,
)
from osfleet.replicas.errors import (
    CapacityError,
    ForkTooDeepError,
    GuestFileConflictError,
    GuestFileNotFoundError,
    GuestPathRefusedError,
    LeaseError,
    NoReplicaAvailableError,
    ReplicaBusyError,
    ReplicaNotFoundError,
    StateImageChangedError,
)
from osfleet.replicas.input import InputError
from osfleet.replicas.quota import SAVE_RETRY_AFTER_SECONDS
from osfleet.replicas.records import InvalidTransitionError
from osfleet.replicas.tunnels import TunnelNotFoundError, TunnelRefusedError, TunnelStalledError
from osfleet.tasks.model import TaskError
from osfleet.tasks.runner import TaskSetupError, VerifierError


class NotFound(OsfleetError):
    """A resource of the API (an OSGym vm id, an unknown task) does not exist for this caller."""


class Conflict(OsfleetError):
    """The request does not fit the replica's episode (e.g. evaluate before a task was set)."""


class Forbidden(OsfleetError):
    """The caller is known but may not do this: an operator's operation (scale-up, ``/v1/host``, the warm
    pool), or a root shell for a client on a host that does not allow it."""


class Throttled(OsfleetError):
    """The caller's own share of the host is in use (``osfleet.api.admission``): 429 with ``Retry-After``, nothing of
    the request done. Another client's load never causes it."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShareFull(OsfleetError):
    """What the caller keeps on the host (saved forks and checkpoints) fills its share of the host's fork budget:
    409 ``quota``, until it releases or deletes some (``osfleet.api.admission``, ``osfleet.replicas.quota``)."""


class LargerThanShare(OsfleetError):
    """A fork or checkpoint larger by itself than the caller's whole share of the host's fork budget: 413, it can
    never be kept there."""


class SavesPending(Throttled):
    """Only the caller's own forks or checkpoints being saved now make another pass its share: 429, retried once
    they end (``osfleet.replicas.quota``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=SAVE_RETRY_AFTER_SECONDS)


class PayloadTooLarge(OsfleetError):
    """A request body over the server's limit (refused before it is read)."""


class Relayed(OsfleetError):
    """An error a host agent answered, passed on by the gateway (or its dashboard) with the host's kind."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


# Which kind each of the server's exceptions is (its status comes from the protocol's one table); the first
# match wins, so more precise classes come before the classes they derive from.
KIND: list[tuple[type[Exception], ErrorKind]] = [
    (NotFound, "not_found"),
    (TunnelNotFoundError, "not_found"),
    (TunnelRefusedError, "conflict"),
    (TunnelStalledError, "conflict"),
    (CheckpointNotFoundError, "not_found"),
    (CheckpointExistsError, "conflict"),
    (CheckpointTooLargeError, "too_large"),
    (CheckpointSavesPendingError, "throttled"),
    (CheckpointQuotaError, "quota"),
    (Throttled, "throttled"),
    (ShareFull, "quota"),
    (LargerThanShare, "too_large"),
    (ForkTooDeepError, "conflict"),
    (StateImageChangedError, "conflict"),
    (CheckpointNameError, "invalid_request"),
    (Conflict, "conflict"),
    (Forbidden, "forbidden"),
    (PayloadTooLarge, "too_large"),
    (ReplicaNotFoundError, "not_found"),
    (ImageNotFoundError, "not_found"),
    (GuestPathRefusedError, "forbidden"),
    (GuestFileNotFoundError, "not_found"),
    (GuestFileConflictError, "conflict"),
    (GuestFileTooLargeError, "too_large"),
    (LeaseError, "lease"),
    (ReplicaBusyError, "busy"),
    (InvalidTransitionError, "busy"),
    (InputError, "invalid_action"),
    (ActionStringError, "invalid_action"),
    (TaskError, "invalid_task"),
    (NoReplicaAvailableError, "capacity"),
    (CapacityError, "capacity"),
    (TaskSetupError, "infrastructure"),
    (VerifierError, "infrastructure"),
    (GuestTimeoutError, "infrastructure"),
    (VirtError, "infrastructure"),
]


def classify(exc: Exception) -> tuple[int, ErrorKind]:
    """The status and kind of one of osfleet's errors (anything unforeseen is an infrastructure failure)."""
    if isinstance(exc, Relayed):
        return STATUS[exc.kind], exc.kind
    for cls, kind in KIND:
        if isinstance(exc, cls):
            return STATUS[kind], kind
    return STATUS["infrastructure"], "infrastructure"


def relayed(status: int, body: object, where: str) -> Relayed:
    """A host's error answer as an exception the gateway's handlers answer the same way (kind and status)."""
    reason = body.get("error") if isinstance(body, dict) else None
    return Relayed(f"{where}: {reason or f'HTTP {status}'}", kind_of(status, body))


def install(app: FastAPI, on_error: object = None) -> None:
    @app.exception_handler(OsfleetError)
    async def _osfleet(request: Request, exc: OsfleetError) -> JSONResponse:
        code, kind = classify(exc)
        if callable(on_error):
            on_error(kind)
        headers = {"Retry-After": "2"} if code == 503 else None
        if code == 429:  # a host's 429 relayed by the gateway keeps the client retrying too
            headers = {"Retry-After": str(getattr(exc, "retry_after", 1))}
        return JSONResponse(status_code=code, content={"error": str(exc), "kind": kind}, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, headers = exc.status_code, dict(exc.headers or {})
        if code == 400:  # a body that is not JSON at all: malformed like any other request (documented 422)
            code = 422
        if code == 405:  # Starlette names only the first matching route's methods; a path may have several
            headers["Allow"] = ", ".join(sorted(_methods_of(app, request.url.path)))
        kind = USUAL_KIND.get(code, "invalid_request")
        return JSONResponse(status_code=code, content={"error": str(exc.detail), "kind": kind}, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = str(first.get("msg"))
        given = first.get("input")
        if isinstance(given, str | int | float) and not isinstance(given, bool):
            message += f" (got {str(given)[:80]!r})"  # names the unsupported value, e.g. a metric osfleet lacks
        return JSONResponse(
            status_code=422,
            content={
                "error": f"{where}: {message}" if where else message,
                "kind": "invalid_request",
                "detail": jsonable(exc.errors()),
            },
        )


def jsonable(errors: object) -> object:
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(errors, custom_encoder={Exception: str})


def _methods_of(app: FastAPI, path: str) -> set[str]:
    """Every method the published API serves at ``path`` (from the OpenAPI, which lists them all)."""
    methods: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\\{[^/]+\\}", "[^/]+", re.escape(template)), path):
            methods |= {m.upper() for m in operations}
    return methods
