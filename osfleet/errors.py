"""The project's error hierarchy.

Every failure a user can cause or fix is one of these, carrying a one-line message that says what
went wrong and what to do; the CLI prints that line and exits non-zero instead of a traceback.
"""

from __future__ import annotations

import errno
import logging

from pydantic import ValidationError

log = logging.getLogger(__name__)


class OsfleetError(Exception):
    """Base of every error osfleet reports to a user."""

    exit_code = 1


class ConfigError(OsfleetError):
    """A setting (environment variable, option, config file) has a value osfleet cannot use."""


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


class GuestCommandKilledError(GuestTimeoutError):
    """A command in the guest ran out of its time and the guest's own ``timeout`` killed it: the guest agent
    answered, the command did not finish. Where the command read a value for a check, that is the guest's doing
    (a desktop kept busy, a program that hangs): the check scores 0 with this message
    (``osfleet.tasks.osworld_format.getters``); elsewhere it is a timeout like any other."""


class GuestFileTooLargeError(OsfleetError):
    """A file in the guest is larger than the host reads for a check: the guest's doing, so the check scores 0
    with this message ("file over N MiB"); never an infrastructure failure, never scored on a cut-off copy."""


class HostIOError(OsfleetError):
    """Reading or writing one of the host's own files failed (an overlay, a record, a saved state)."""


class InternalError(OsfleetError):
    """A bug or an unforeseen failure; logged with its traceback, reported as an infrastructure failure."""


def as_osfleet(exc: BaseException, context: str) -> OsfleetError:
    """The error boundary: any exception raised while changing a replica becomes an osfleet error with a
    kind, so callers mark the replica failed and the API answers with a precise status, never a bare 500.

    ``context`` says what was being done ("resetting r-1234"); it starts the message of errors that are
    not already osfleet's own.
    """
    if isinstance(exc, OsfleetError):
        return exc
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return DiskFullError(f"{context}: disk full{where}")
        return HostIOError(f"{context}: {reason}{where}")
    try:
        import libvirt

        if isinstance(exc, libvirt.libvirtError):
            message = (exc.get_error_message() or str(exc)).splitlines()[0]
            return VirtError(f"{context}: libvirt: {message}")
    except ImportError:  # pragma: no cover - libvirt-python is a dependency
        pass
    log.error("unexpected error while %s", context, exc_info=exc)
    return InternalError(f"{context}: unexpected {type(exc).__name__}: {str(exc)[:200]}")


def first_problem(exc: ValidationError, whole: str) -> str:
    """``field.path: message`` for the first problem pydantic found (``whole`` when it is not in a field)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or whole
    return f"{where}: {first['msg']}"
