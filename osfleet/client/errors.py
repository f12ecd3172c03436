"""What a call to a host agent or gateway can raise: one exception type per thing a trainer does differently.

The split that matters most: ``InfrastructureError`` (the replica, its host or the network failed; discard the
rollout, it says nothing about the agent) versus a score. The client never turns an infrastructure failure
into a reward of 0, and never lets a bare HTTP error or a hang reach the caller.
"""

from __future__ import annotations

from typing import Any

from osfleet.protocol.errors import ErrorKind, kind_of


class FleetError(Exception):
    """Any refusal or failure of the fleet, with the server's one-line reason and its ``kind``."""

    status: int | None = None

    def __init__(self, message: str, *, status: int | None = None, kind: str | None = None, body: Any = None):
        super().__init__(message)
        self.status = status if status is not None else type(self).status
        self.kind = kind
        self.body = body


class AuthenticationError(FleetError):
    """401: the token is missing or wrong."""

    status = 401


class ForbiddenError(FleetError):
    """403: the caller may not do this (an operator's operation, or a root shell the host's policy refuses)."""

    status = 403


class NotFoundError(FleetError):
    """404: an unknown (or someone else's) replica, lease, task or vm id."""

    status = 404


class LeaseError(FleetError):
    """409: the lease expired, was released, or the replica was taken back (a new lease is needed)."""

    status = 409


class ConflictError(FleetError):
    """409: the request does not fit the episode as it is (evaluate before a task was set, task and task_id)."""

    status = 409


class BusyError(FleetError):
    """409: the replica is busy (a person took it over from the dashboard, or a step is still running)."""

    status = 409


class InvalidRequestError(FleetError):
    """413/422: the request itself is wrong (or too large: a body over the server's limit, a fork or checkpoint
    larger than the client's whole quota); retrying it unchanged cannot succeed."""

    status = 422


class InvalidActionError(InvalidRequestError):
    """422: an action is malformed or cannot be carried out as given (off-screen, untypable, unknown key)."""


class InvalidTaskError(InvalidRequestError):
    """422: the task is malformed or uses a feature this host does not support (the feature is named)."""


class CapacityError(FleetError):
    """503 capacity: no replica was free within the time the caller allowed."""

    status = 503


class ThrottledError(FleetError):
    """429: this client's own share of the host is in use (requests in flight, bodies being received, evaluations
    under way); nothing of the request was done, so it is sent again after the server's ``Retry-After``. Another
    client's load never causes it."""

    status = 429


class QuotaError(FleetError):
    """409 (kind ``quota``; 507 from an osfleet before 2026-12-06): what the client keeps on the host fills its quota
    or share (its checkpoints' number or bytes, or its saved forks' and checkpoints' share of the host's fork budget,
    named in the message). Its own doing, so waiting does not help: delete a checkpoint or release forked replicas.
    One larger than the whole quota is an ``InvalidRequestError`` (413); one that only the client's own saves under
    way keep out is a 429, waited out like any other."""

    status = 409


class InfrastructureError(FleetError):
    """The replica, its host or the connection failed: the episode says nothing about the agent. Never a
    reward of 0; discard or retry the rollout."""

    status = 503


# One client exception per kind of the protocol's table (a test checks that every kind has one).
BY_KIND: dict[ErrorKind, type[FleetError]] = {
    "unauthorized": AuthenticationError,
    "forbidden": ForbiddenError,
    "not_found": NotFoundError,
    "lease": LeaseError,
    "busy": BusyError,
    "conflict": ConflictError,
    "too_large": InvalidRequestError,
    "invalid_request": InvalidRequestError,
    "invalid_action": InvalidActionError,
    "invalid_task": InvalidTaskError,
    "capacity": CapacityError,
    "throttled": ThrottledError,
    "quota": QuotaError,
    "infrastructure": InfrastructureError,
}


def _about_task(body: Any) -> bool:
    """A request refused by the schema because of its task (``task``, OSGym's ``task_config``)."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, list) or not detail or not isinstance(detail[0], dict):
        return False
    loc = [str(x) for x in detail[0].get("loc", []) if x != "body"]
    return bool(loc) and loc[0] in ("task", "task_config")


def from_response(status: int, body: Any, what: str) -> FleetError:
    """The exception for an error answer of the osfleet API (``{"error": ..., "kind": ...}``): by its kind, or,
    when it names none that fits its status (a proxy in between), by its status's usual kind."""
    kind = kind_of(status, body)
    reason = body.get("error") if isinstance(body, dict) else None
    message = f"{what}: {reason or f'HTTP {status}'}"
    cls = BY_KIND[kind]
    if kind == "invalid_request" and _about_task(body):
        cls = InvalidTaskError
    named = body.get("kind") if isinstance(body, dict) else None
    return cls(message, status=status, kind=named if isinstance(named, str) else None, body=body)
