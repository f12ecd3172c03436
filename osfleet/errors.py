"""The project's error hierarchy.

Every failure a user can cause or fix is one of these, carrying a one-line message that says what
went wrong and what to do; the CLI prints that line and exits non-zero instead of a traceback.
"""

from __future__ import annotations

from pydantic import ValidationError


class OsfleetError(Exception):
    """Base of every error osfleet reports to a user."""

    exit_code = 1


class MissingToolError(OsfleetError):
    """A program osfleet needs is not installed on the host that has to run it."""

    def __init__(self, tool: str, package: str | None = None, where: str = "this host") -> None:
        hint = f" (apt-get install {package})" if package else ""
        super().__init__(f"missing tool on {where}: {tool}{hint}")
        self.tool = tool


class BadRecipeError(OsfleetError):
    """A golden-image recipe is unreadable or invalid."""


class DiskFullError(OsfleetError):
    """Not enough free disk for the operation; raised before anything is half-written where possible."""


class ImageInUseError(OsfleetError):
    """An image cannot be replaced or removed because a process or replica still uses it."""


class ImageNotFoundError(OsfleetError):
    """No golden image matches what was asked for."""


class HostUnreachableError(OsfleetError):
    """The SSH connection to a host failed."""


class CommandFailedError(OsfleetError):
    """A command on a host failed for a reason that is not one of the more precise errors."""


class VirtError(OsfleetError):
    """libvirt refused or failed an operation; the message names the domain and libvirt's reason."""


class GuestTimeoutError(OsfleetError):
    """A guest did not reach the expected state in time."""


def first_problem(exc: ValidationError, whole: str) -> str:
    """``field.path: message`` for the first problem pydantic found (``whole`` when it is not in a field)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or whole
    return f"{where}: {first['msg']}"
