"""Errors of the replica layer; the API maps each to a status in one table (osfleet/api/errors.py)."""

from __future__ import annotations

from osfleet.errors import OsfleetError


class ReplicaNotFoundError(OsfleetError):
    """No replica with that id on this host."""


class ReplicaBusyError(OsfleetError):
    """The replica is in a state that does not allow the operation (e.g. resetting, failed)."""


class NoReplicaAvailableError(OsfleetError):
    """No ready replica to lease right now."""


class CapacityError(OsfleetError):
    """The host cannot take that many more replicas (its configured maximum or its memory reserve)."""


class ForkTooDeepError(CapacityError):
    """The replica is a fork of a fork as deep as this host allows (``Settings.fork_max_depth``): forking it can never
    succeed, its ancestor can be forked instead. One of the host's limits (so a ``CapacityError``, as callers that
    catch those expect), but the request's own: the API answers 409 ``conflict``, not a shortage's 503."""


class StateImageChangedError(OsfleetError):
    """A checkpoint or fork was saved on an image whose disk was replaced since (a rebuild under the same name): its
    guest's memory holds blocks of other bytes, so it is never restored (409 ``conflict``; deleting it is the client's
    call, never done for it)."""


class LeaseError(OsfleetError):
    """The lease is unknown, expired or held by someone else."""


class ReplicaFailedError(OsfleetError):
    """The replica's QEMU or guest failed; it is being rebuilt (an infrastructure failure, never reward 0)."""


class LeaseLostError(OsfleetError):
    """The lease ended because its replica failed and was rebuilt: lease again (an infrastructure failure)."""


class GuestPathRefusedError(OsfleetError):
    """A client named a file in the desktop where osfleet does not move files (outside the desktop user's home and
    /tmp, or a path that is not normalised), or the desktop user may not read or write it there."""


class GuestFileNotFoundError(OsfleetError):
    """No file at that path in the desktop, or none the desktop user can see."""


class GuestFileConflictError(OsfleetError):
    """The desktop's files are not as the request needs: a folder where the file would go, a file to read that is
    not a regular one, a guest that cannot hold the file (its disk full): the guest's reason is named."""
