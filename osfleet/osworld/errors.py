"""What the protocol server answers when a request cannot be served: one table from error to HTTP status.

OSWorld's controllers only ever test ``status_code == 200`` (anything else is retried, then logged), so the
status is for people and logs reading the exchange; the body keeps the shape OSWorld's own server gives for that
endpoint (``endpoints.ErrorShape``). The split that matters: a request this server could not read (4xx), the
guest that could not finish the command (500, what OSWorld's server answers for an exception in its handler),
osfleet refusing it for a reason of its own (its status: 403, 404, 413, 422), and the fleet failing (502: this
server is a gateway in front of it).
"""

from __future__ import annotations

from osfleet.client import FleetError, ForbiddenError, InvalidRequestError, NotFoundError
from osfleet.errors import OsfleetError


class HarnessError(Exception):
    """A request the protocol server answers with an error of its own (never a fleet error passed on)."""

    status = 500


class BadRequest(HarnessError):
    """The body is not what the endpoint reads (no JSON object, a field missing or of the wrong type)."""

    status = 400


class FileRefused(HarnessError):
    """A guest path osfleet's file transfer does not reach (outside the desktop user's home and /tmp)."""

    status = 403


class NotThere(HarnessError):
    """What the request names is not in the guest (a file, a window, a folder), as OSWorld answers 404."""

    status = 404


class MethodNotAllowed(HarnessError):
    status = 405


class LengthRequired(HarnessError):
    """A body without ``Content-Length`` (chunked): refused rather than read without a bound."""

    status = 411


class TooLarge(HarnessError):
    """A body over the endpoint's limit, refused before it is read."""

    status = 413


class UnsupportedMediaType(HarnessError):
    """A JSON endpoint sent something that is not JSON (OSWorld's Flask server answers 415 too)."""

    status = 415


class GuestFailed(HarnessError):
    """The guest did not finish the command (timed out and killed, or could not start it)."""

    status = 500


class RecordingError(HarnessError):
    """A recording that cannot be answered: none in progress (400), none taken (500), no encoder here (501), a
    video too large (413)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NotSupported(HarnessError):
    """An endpoint this groundwork does not serve yet (recording, the guest's own downloads): said so, not faked."""

    status = 501


UPSTREAM_STATUS = 502  # the fleet failed or refused in a way the caller cannot fix (lease gone, host down)


def status_of(exc: Exception) -> int:
    """The HTTP status for an error raised while serving a request (the module's docstring has the split)."""
    if isinstance(exc, HarnessError):
        return exc.status
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ForbiddenError):
        return 403
    if isinstance(exc, InvalidRequestError):
        return exc.status or 422  # 413 for a file over the fleet's limits, 422 for an action it refuses
    if isinstance(exc, FleetError):
        return UPSTREAM_STATUS
    if isinstance(exc, OsfleetError):  # a guest query that could not answer (osfleet.tasks.osworld_format.guest_query)
        return GuestFailed.status
    raise TypeError(f"not an error the protocol server answers: {type(exc).__name__}")


HANDLED: tuple[type[Exception], ...] = (HarnessError, FleetError, OsfleetError)
"""What ``status_of`` maps; anything else is a bug, logged with its traceback and not answered as an error."""
