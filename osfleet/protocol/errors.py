"""Every error answer of the API, and the one table of error kinds and HTTP statuses.

The server names each failure with a ``kind`` and answers with that kind's status (``STATUS``); the client turns
an answer back into one exception type per kind (``osfleet.client.errors``); the gateway and the dashboard pass a
host's answer on with its kind. One table, read by all three, so a refusal cannot change meaning on the way (a
policy refusal is 403 ``forbidden`` everywhere, never an infrastructure failure).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

ErrorKind = Literal[
    "unauthorized",
    "forbidden",
    "not_found",
    "lease",
    "busy",
    "conflict",
    "too_large",
    "invalid_request",
    "invalid_action",
    "invalid_task",
    "capacity",
    "throttled",
    "quota",
    "infrastructure",
]
KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)

STATUS: dict[ErrorKind, int] = {
    "unauthorized": 401,  # the bearer token is missing or wrong
    "forbidden": 403,  # the caller is known but may not do this (an operator's operation, a root shell)
    "not_found": 404,  # unknown, or another client's (not confirmed to exist)
    "lease": 409,  # the lease expired, was released, or does not hold the replica
    "busy": 409,  # the replica is busy (taken over from the dashboard, a step under way)
    "conflict": 409,  # the request does not fit the episode (evaluate before a task was set)
    "too_large": 413,  # the body is over the server's limit (refused unread)
    "invalid_request": 422,  # malformed: retrying it unchanged cannot succeed
    "invalid_action": 422,  # an action cannot be carried out as given (off-screen, untypable, unknown key)
    "invalid_task": 422,  # the task is malformed or uses a feature this host does not run
    "capacity": 503,  # no replica free now: retry after Retry-After
    "throttled": 429,  # the client's own share of the host is in use (requests, bodies, evaluations): retry after
    "quota": 409,  # what the client keeps on the host fills its quota or share (checkpoints, forks): delete first
    "infrastructure": 503,  # the replica, its guest or its host failed: never a reward of 0
}

# The kind an answer without one (a proxy in between, a bare HTTP error) is taken to have, by its status.
USUAL_KIND: dict[int, ErrorKind] = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    409: "lease",
    413: "too_large",
    422: "invalid_request",
    429: "throttled",
    503: "infrastructure",
    507: "quota",  # an osfleet before 2026-12-06 answered a full quota so
}

WHY: dict[int, str] = {
    401: "missing or wrong bearer token",
    403: "the operator's token is needed: scale-up, /v1/host, replicas of the warm pool, or a shell as_root "
    "(unless the host runs with --allow-agent-root); or a file path the desktop user may not use (named)",
    404: "unknown replica, task or vm id, or one that is another client's (not confirmed to exist)",
    409: "the lease is expired, released or does not hold the replica, the replica is busy, or it is a fork as deep "
    "as the host allows (fork its ancestor); or (kind: quota) what the client keeps on this host fills its quota "
    "or share (the figure is named): delete a checkpoint or release forked replicas first, waiting does not help",
    413: "the request body is over the server's limit (refused before it is read), or a file to download is over "
    "the most a host reads from a guest, or a fork or checkpoint larger than the client's whole quota or share "
    "(named)",
    422: "malformed request, action or task (the problem is named)",
    429: "this client's own share of the host is in use now (requests in flight, bodies being received, "
    "evaluations, its own forks or checkpoints being saved): nothing of the request was done; retry after "
    "Retry-After (other clients are not affected)",
    503: "no capacity right now (a host-wide shortage, no client's excess), or the replica or guest failed (kind: "
    "infrastructure, never a reward of 0)",
}


class ErrorBody(BaseModel):
    """Every error: one readable line, and a kind a client can branch on."""

    error: str = Field(description="what went wrong, in one line")
    kind: str = Field(description=" | ".join(KINDS))
    detail: list[dict[str, Any]] | None = Field(None, description="for invalid_request: every problem found")


def kind_of(status: int, body: Any) -> ErrorKind:
    """The kind of an error answer: the one it names when that fits its status, else its status's usual kind
    (anything unexpected, a 502 from a proxy say, is an infrastructure failure)."""
    named = body.get("kind") if isinstance(body, dict) else None
    if named in STATUS and STATUS[named] == status:
        return named  # type: ignore[no-any-return]
    return USUAL_KIND.get(status, "infrastructure")
