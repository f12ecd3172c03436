"""The lease book: who holds which replica until when, and the reset that follows every release.

A released replica is reset before anyone else can lease it: ``release`` keeps the replica's lock from
the moment the lease ends until its new generation is ready, and the replica is ``resetting`` meanwhile,
so ``lease`` (which skips busy and non-ready replicas) can never hand out a dirty desktop.

Every call that touches a leased replica for a client carries a ``Claim`` (the lease, its owner, the
generation the episode is on), checked by ``touching`` *under the replica's lock*, in the same critical
section as the work: a step that waited behind a release, an expiry or another tenant's lease is refused
there, so it can never act on, read from or write the episode of the replica's next holder. A claim whose
owner is not the replica's holder is told that the replica does not exist (an API answers 404: another
tenant's replica is not confirmed to exist).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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
# How long a lease waits for a ready replica that is busy for a moment (being parked after its bring-up or
# reset, a QMP call or two) when no other is free: a client asking then would otherwise get 503 while the
# host has a replica for it (a CI run's lease met exactly that right after the warm replica came up).
BUSY_READY_WAIT_SECONDS = 3.0
EXPIRED_LEASES_REMEMBERED = 10000

ResetLocked = Callable[[ReplicaRecord, State], object]


@dataclass(frozen=True)
class Claim:
    """What a call may touch: the replica must be leased to ``owner`` (None: anyone, the operator), under
    ``lease_id`` (None: any of the owner's leases), on ``generation`` (None: any). Checked by ``touching``."""

    owner: str | None = None
    lease_id: str | None = None
    generation: int | None = None


@dataclass(frozen=True)
class _Ended:
    """A lease that ended, remembered so that its late holder hears why (409) rather than "unknown"."""

    replica: str | None  # None: not known (a lease lost in a recovery after a restart)
    owner: str | None
    why: str
    lost: bool  # ended because the replica failed: an infrastructure failure, not the holder's doing


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
        # Leases ended by expiry, release or a failure, so a late caller hears why rather than "unknown lease".
        self._ended: OrderedDict[str, _Ended] = OrderedDict()
        self._lock = threading.Lock()

    def lease(
        self, holder: str, seconds: float = DEFAULT_LEASE_SECONDS, owner: str = ""
    ) -> tuple[ReplicaRecord, Lease]:
        """Hand out a ready replica (never one booting, resetting or being worked on) to ``owner``. A ready
        replica whose lock is held for a moment (being parked right after its bring-up, its liveness probed)
        is waited for up to ``BUSY_READY_WAIT_SECONDS`` when no other is free, rather than answered "none"."""
        busy = []
        for rec in self.registry.all():
            if rec.state != State.READY:
                continue
            try:
                with self.registry.locked(rec.id, wait=False) as live:
                    if (taken := self._take_locked(live, holder, seconds, owner)) is not None:
                        return taken
            except ReplicaBusyError:
                busy.append(rec.id)
            except ReplicaNotFoundError:
                continue
        until = time.monotonic() + BUSY_READY_WAIT_SECONDS
        for rid in busy:
            try:
                with self.registry.locked(rid, timeout=max(until - time.monotonic(), 0.0)) as live:
                    if (taken := self._take_locked(live, holder, seconds, owner)) is not None:
                        return taken
            except (ReplicaNotFoundError, ReplicaBusyError):
                continue
        raise NoReplicaAvailableError("no ready replica to lease; try again shortly")

    def _take_locked(
        self, live: ReplicaRecord, holder: str, seconds: float, owner: str
    ) -> tuple[ReplicaRecord, Lease] | None:
        """Lease ``live`` (its lock held) if it is still ready; None when it is not (or could not resume)."""
        if live.state != State.READY:
            return None
        if live.parked and self._unpark_locked is not None:
            try:
                self._unpark_locked(live)
            except Exception as exc:  # the monitor rebuilds it; the next ready replica is tried
                self.registry.fail(live, f"resuming the parked replica failed: {as_osfleet(exc, 'resuming')}")
                return None
        live.lease = _new_lease(holder, seconds, owner)
        live.move(State.LEASED)
        try:
            self.registry.save(live)
        except OsfleetError:
            live.lease = None
            live.move(State.READY)
            raise
        return live.model_copy(deep=True), live.lease

    def grant(self, rec: ReplicaRecord, holder: str, seconds: float, owner: str = "") -> Lease:
        """Lease the ready replica ``rec``, whose lock the caller holds, to ``holder``/``owner`` (a fork's
        children go to whoever forked; the caller saves the record)."""
        lease = _new_lease(holder, seconds, owner)
        rec.lease = lease
        rec.move(State.LEASED)
        return lease

    def check(self, replica_id: str, lease_id: str, owner: str | None = None) -> ReplicaRecord:
        """The replica's record if ``lease_id`` (of ``owner``) holds it now; else a ``LeaseError`` saying why
        not (``ReplicaNotFoundError`` when it is not ``owner``'s). Without the replica's lock: a check before
        work, not instead of ``touching``."""
        rec = self.registry.get(replica_id)
        self.check_locked(rec, Claim(owner, lease_id))
        return rec

    def check_locked(self, rec: ReplicaRecord, claim: Claim) -> None:
        """Raise unless ``claim`` holds ``rec`` now (the caller holds the replica's lock, or has a copy)."""
        rid, lease_id = rec.id, claim.lease_id
        if lease_id is not None:
            with self._lock:
                ended = self._ended.get(lease_id)
            # told to its own holder and the operator (and to anyone when the owner is unknown: lease ids are
            # secrets); another client is not told that the replica exists
            told = claim.owner is None or (ended is not None and ended.owner in (None, claim.owner))
            if ended is not None and ended.replica in (None, rid) and told:
                raise (LeaseLostError if ended.lost else LeaseError)(ended.why)
        if claim.owner is not None and (rec.lease is None or rec.lease.owner != claim.owner):
            raise ReplicaNotFoundError(f"no replica {rid}")  # another tenant's: not confirmed to exist
        if lease_id is not None:
            if rec.lease is None or rec.lease.id != lease_id:
                raise LeaseError(f"lease {lease_id} does not hold replica {rid}")
            if rec.lease.expired():
                raise LeaseError(f"lease {lease_id} on replica {rid} has expired")
        if claim.generation is not None and rec.generation != claim.generation:
            raise LeaseError(
                f"replica {rid} is on generation {rec.generation}, not {claim.generation} as this episode: it was "
                "reset or rebuilt meanwhile"
            )

    @contextmanager
    def touching(self, replica_id: str, claim: Claim | None) -> Iterator[ReplicaRecord]:
        """The replica's live record under its lock, once ``claim`` (if any) is found to hold it: whatever the
        caller does inside happens to the replica of that lease and no other."""
        with self.registry.locked(replica_id) as rec:
            if claim is not None:
                self.check_locked(rec, claim)
            yield rec

    def release(self, replica_id: str, lease_id: str, owner: str | None = None) -> bool:
        """End a lease (of ``owner``, when given) and reset the replica before anyone else can lease it.

        Returns whether the replica is ready again. A reset that fails leaves the replica failed (the
        monitor rebuilds it); the lease has ended either way, so the caller is not told of it as an error.
        """
        with self.registry.locked(replica_id) as rec:
            if rec.lease is None or rec.lease.id != lease_id:
                self.check_locked(rec, Claim(owner, lease_id))  # says why: ended, or not the owner's replica
                raise LeaseError(f"lease {lease_id} does not hold replica {replica_id}")
            if owner is not None and rec.lease.owner != owner:
                raise ReplicaNotFoundError(f"no replica {replica_id}")
            self._remember(lease_id, _Ended(rec.id, rec.lease.owner, f"lease {lease_id} was released", False))
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
        held = next((r for r in self.registry.all() if r.lease is not None and r.lease.id == lease_id), None)
        owner = held.lease.owner if held is not None and held.lease is not None else None
        self._remember(lease_id, _Ended(held.id if held else None, owner, why, True), replace=True)

    def expired_leases(self) -> list[tuple[str, str]]:
        """(replica, lease) of every lease past its end; each is remembered as expired."""
        due = []
        for rec in self.registry.all():
            if rec.state == State.LEASED and rec.lease is not None and rec.lease.expired():
                due.append((rec.id, rec.lease.id))
                why = f"lease {rec.lease.id} on replica {rec.id} has expired"
                self._remember(rec.lease.id, _Ended(rec.id, rec.lease.owner, why, False))
        return due

    def _remember(self, lease_id: str, ended: _Ended, replace: bool = False) -> None:
        """The first reason a lease ended is the one told (an expiry stays an expiry after the release that
        follows it); a failure replaces any (the replica is being rebuilt)."""
        with self._lock:
            if replace or lease_id not in self._ended:
                self._ended[lease_id] = ended
            while len(self._ended) > EXPIRED_LEASES_REMEMBERED:
                self._ended.popitem(last=False)


def _new_lease(holder: str, seconds: float, owner: str) -> Lease:
    return Lease(id=uuid.uuid4().hex, holder=holder, expires_at=time.time() + seconds, owner=owner)
