"""The one error of ``osfleet e2b serve``: a refusal with the HTTP status E2B's SDKs branch on, and its reason.

Both planes raise it: the control plane answers it as E2B's ``{"code", "message"}`` body, the daemon's HTTP routes
likewise and its Connect RPCs as the Connect code of that status (``envd``). A refusal of the fleet keeps the
fleet's status (401 a wrong key, 404 another client's thing, 409 a lease that ended or a full quota, 429, 503), but
for a request it found malformed, which E2B's API calls 400.
"""

from __future__ import annotations

from osfleet.client import FleetError


class E2BError(Exception):
    """A request refused (or failed) with ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def from_fleet(exc: FleetError) -> E2BError:
    """The fleet's refusal as this server's: its status (422 as E2B's 400) and its reason."""
    status = exc.status or 503
    return E2BError(400 if status == 422 else status, str(exc))
