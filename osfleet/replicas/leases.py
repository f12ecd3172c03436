"""The lease book: who holds which replica until when, and the reset that follows every release.

A released replica is reset before anyone else can lease it: ``release`` keeps the replica's lock from
the moment the lease ends until its new generation is ready, and the replica is ``resetting`` meanwhile,
so ``lease`` (which skips busy and non-ready replicas) can never hand out a dirty desktop.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

from osfleet.errors import OsfleetError, as_osfleet
from osfleet.replicas.errors import (
    LeaseError,
    LeaseLostError,
    NoReplicaAvailableError,
    ReplicaBusyError,
    ReplicaNotFoundError,
)
from osfleet.replicas.records import Lease, ReplicaRecord, State
from osfleet.replicas.registry import Registry

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 600.0
EXPIRED_LEASES_REMEMBERED = 10000

ResetLocked = Callable[[ReplicaRecord, State], object]


class LeaseBook:
    """Leases on the replicas of ``registry``; ``reset_locked(record, then)`` resets a replica whose lock
    the caller holds and leaves it in state ``then``."""

    def __init__(
        self,
        registry: Registry,
        reset_locked: ResetLocked,
        unpark_locked: Callable[[ReplicaRecord], None] | None = None,
    ) -> None:
        """``unpark_locked(record)`` resumes a parked replica whose lock the caller holds (see ``Lifecycle``)."""
        self.registry = registry
        self._reset_locked = reset_locked
        self._unpark_locked = unpark_locked
        # Leases ended by expiry or by a failure, so a late caller hears why rather than "unknown lease".
        self._expired: OrderedDict[str, str] = OrderedDict()
        self._lost: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def lease(self, holder: str, seconds: float = DEFAULT_LEASE_SECONDS) -> tuple[ReplicaRecord, Lease]:
        """Hand out a ready replica (never one booting, resetting or being worked on)."""
        for rec in self.registry.all():
            if rec.state != State.READY:
                continue
            try:
                with self.registry.locked(rec.id, wait=False) as live:
                    if live.state != State.READY:
                        continue
                    if live.parked and self._unpark_locked is not None:
                        try:
                            self._unpark_locked(live)
                        except Exception as exc:  # the monitor rebuilds it; the next ready replica is tried
                            self.registry.fail(
                                live, f"resuming the parked replica failed: {as_osfleet(exc, 'resuming')}"
                            )
                            continue
                    live.lease = Lease(id=uuid.uuid4().hex, holder=holder, expires_at=time.time() + seconds)
                    live.move(State.LEASED)
                    try:
                        self.registry.save(live)
                    except OsfleetError:
                        live.lease = None
                        live.move(State.READY)
                        raise
                    return live.model_copy(deep=True), live.lease
            except (ReplicaNotFoundError, ReplicaBusyError):
                continue
        raise NoReplicaAvailableError("no ready replica to lease; try again shortly")

    def grant(self, rec: ReplicaRecord, holder: str, seconds: float) -> Lease:
        """Lease the ready replica ``rec``, whose lock the caller holds, to ``holder`` (a fork's children go
        to whoever forked; the caller saves the record)."""
        lease = Lease(id=uuid.uuid4().hex, holder=holder, expires_at=time.time() + seconds)
        rec.lease = lease
        rec.move(State.LEASED)
        return lease

    def check(self, replica_id: str, lease_id: str) -> ReplicaRecord:
        """The replica's record if ``lease_id`` holds it now; else a ``LeaseError`` saying why not."""
        rec = self.registry.get(replica_id)
        with self._lock:
            lost = self._lost.get(lease_id)
            expired = self._expired.get(lease_id) == replica_id
        if lost is not None:
            raise LeaseLostError(lost)
        if expired:
            raise LeaseError(f"lease {lease_id} on replica {replica_id} has expired")
        if rec.lease is None or rec.lease.id != lease_id:
            raise LeaseError(f"lease {lease_id} does not hold replica {replica_id}")
        if rec.lease.expired():
            raise LeaseError(f"lease {lease_id} on replica {replica_id} has expired")
        return rec

    def release(self, replica_id: str, lease_id: str) -> bool:
        """End a lease and reset the replica before anyone else can lease it.

        Returns whether the replica is ready again. A reset that fails leaves the replica failed (the
        monitor rebuilds it); the lease has ended either way, so the caller is not told of it as an error.
        """
        with self.registry.locked(replica_id) as rec:
            if rec.lease is None or rec.lease.id != lease_id:
                raise LeaseError(f"lease {lease_id} does not hold replica {replica_id}")
            rec.lease = None
            if rec.state != State.LEASED:  # failed meanwhile: recovery rebuilds it, no reset to do
                self.registry.save(rec)
                return False
            try:
                self._reset_locked(rec, State.READY)
            except OsfleetError as exc:
                log.warning("replica %s: reset after release failed: %s", replica_id, exc)
                return False
            return True

    def note_lost(self, lease_id: str, why: str) -> None:
        """A lease ended because its replica failed (recovery calls this before it rebuilds the replica)."""
        with self._lock:
            self._lost[lease_id] = why
            while len(self._lost) > EXPIRED_LEASES_REMEMBERED:
                self._lost.popitem(last=False)

    def expired_leases(self) -> list[tuple[str, str]]:
        """(replica, lease) of every lease past its end; each is remembered as expired."""
        due = []
        for rec in self.registry.all():
            if rec.state == State.LEASED and rec.lease is not None and rec.lease.expired():
                due.append((rec.id, rec.lease.id))
                with self._lock:
                    self._expired[rec.lease.id] = rec.id
                    while len(self._expired) > EXPIRED_LEASES_REMEMBERED:
                        self._expired.popitem(last=False)
        return due
