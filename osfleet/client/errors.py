"""What a call to a host agent or gateway can raise: one exception type per thing a trainer does differently.

The split that matters most: ``InfrastructureError`` (the replica, its host or the network failed; discard the
rollout, it says nothing about the agent) versus a score. The client never turns an infrastructure failure
into a reward of 0, and never lets a bare HTTP error or a hang reach the caller.
"""

from __future__ import annotations

from typing import Any


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


class NotFoundError(FleetError):
    """404: an unknown (or someone else's) replica, lease, task or vm id."""

    status = 404


class LeaseError(FleetError):
    """409: the lease expired, was released, or the replica was taken back (a new lease is needed)."""

    status = 409


class BusyError(FleetError):
    """409: the replica is busy (a person took it over from the dashboard, or a step is still running)."""

    status = 409


class InvalidRequestError(FleetError):
    """413/422: the request itself is wrong; retrying it unchanged cannot succeed."""

    status = 422


class InvalidActionError(InvalidRequestError):
    """422: an action is malformed or cannot be carried out as given (off-screen, untypable, unknown key)."""


class InvalidTaskError(InvalidRequestError):
    """422: the task is malformed or uses a feature this host does not support (the feature is named)."""


class CapacityError(FleetError):
    """503 capacity: no replica was free within the time the caller allowed."""

    status = 503


class InfrastructureError(FleetError):
    """The replica, its host or the connection failed: the episode says nothing about the agent. Never a
    reward of 0; discard or retry the rollout."""

    status = 503


def _about_task(body: Any) -> bool:
    """A request refused by the schema because of its task (``task``, OSGym's ``task_config``)."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, list) or not detail or not isinstance(detail[0], dict):
        return False
    loc = [str(x) for x in detail[0].get("loc", []) if x != "body"]
    return bool(loc) and loc[0] in ("task", "task_config")


def from_response(status: int, body: Any, what: str) -> FleetError:
    """The exception for an error answer of the osfleet API (``{"error": ..., "kind": ...}``)."""
    kind = body.get("kind") if isinstance(body, dict) else None
    reason = body.get("error") if isinstance(body, dict) else None
    message = f"{what}: {reason or f'HTTP {status}'}"
    cls: type[FleetError]
    if status == 401:
        cls = AuthenticationError
    elif status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = BusyError if kind == "busy" else LeaseError
    elif status in (400, 413, 422):
        cls = {"invalid_action": InvalidActionError, "invalid_task": InvalidTaskError}.get(
            kind or "", InvalidTaskError if _about_task(body) else InvalidRequestError
        )
    elif status == 503 and kind == "capacity":
        cls = CapacityError
    else:  # 503 infrastructure, and anything a well-behaved server does not answer (5xx, an odd status)
        cls = InfrastructureError
    return cls(message, status=status, kind=kind, body=body)
