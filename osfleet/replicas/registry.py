"""The replicas one process manages: their records in memory and on disk, one lock per replica.

Every state change of a replica happens while its lock is held (``locked``) and is written to its record
before the lock is let go, so another thread, or a process started after a crash, sees what happened.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from osfleet.errors import OsfleetError, as_osfleet
from osfleet.replicas.errors import ReplicaBusyError, ReplicaFailedError, ReplicaNotFoundError
from osfleet.replicas.records import RUNNING_STATES, RecordStore, ReplicaRecord, State

log = logging.getLogger(__name__)


class Counters:
    """Event counts shared by several threads (failures detected, recoveries, resets)."""

    NAMES = (
        "failures_detected",
        "recoveries",
        "resets",
        "recovery_failures",
        "forks",
        "fork_children",
        "bringup_retries",  # a generation that did not come up, replaced by a new one (``Lifecycle``)
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.NAMES, 0)

    def inc(self, name: str) -> None:
        with self._lock:
            self._values[name] += 1

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


class Registry:
    """Records and locks of this process's replicas. Thread-safe."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self.counters = Counters()
        self._records: dict[str, ReplicaRecord] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def add(self, record: ReplicaRecord) -> None:
        with self._lock:
            self._records[record.id] = record
            self._locks[record.id] = threading.Lock()

    def remove(self, replica_id: str) -> None:
        with self._lock:
            self._records.pop(replica_id, None)
            self._locks.pop(replica_id, None)

    def __contains__(self, replica_id: str) -> bool:
        with self._lock:
            return replica_id in self._records

    @contextmanager
    def locked(self, replica_id: str, wait: bool = True, timeout: float | None = None) -> Iterator[ReplicaRecord]:
        """The live record under its lock. ``wait=False`` raises ``ReplicaBusyError`` instead of waiting
        for another thread's operation (a reset) to finish; ``timeout`` does after waiting that long."""
        with self._lock:
            lock = self._locks.get(replica_id)
        if lock is None:
            raise ReplicaNotFoundError(f"no replica {replica_id}")
        if not (lock.acquire(timeout=timeout) if wait and timeout is not None else lock.acquire(blocking=wait)):
            raise ReplicaBusyError(f"replica {replica_id} is busy")
        try:
            with self._lock:
                record = self._records.get(replica_id)
            if record is None:
                raise ReplicaNotFoundError(f"no replica {replica_id}")
            yield record
        finally:
            lock.release()

    def get(self, replica_id: str) -> ReplicaRecord:
        """A copy of the record as it is now (without waiting for its lock)."""
        with self._lock:
            record = self._records.get(replica_id)
            if record is None:
                raise ReplicaNotFoundError(f"no replica {replica_id}")
            return record.model_copy(deep=True)

    def all(self) -> list[ReplicaRecord]:
        with self._lock:
            return [r.model_copy(deep=True) for r in sorted(self._records.values(), key=lambda r: r.created_at)]

    def domains(self) -> set[str]:
        with self._lock:
            return {r.domain for r in self._records.values()}

    def save(self, record: ReplicaRecord) -> None:
        """Persist the record (the caller holds its lock); a failed write is an osfleet error."""
        record.owner_pid = os.getpid()
        try:
            self.store.save(record)
        except Exception as exc:
            raise as_osfleet(exc, f"writing the record of {record.id}") from exc

    def fail(self, record: ReplicaRecord, reason: str) -> None:
        """Mark the replica failed, in memory first: even when its record cannot be written (disk full) the
        replica is never leased again and the monitor recovers it."""
        if record.state == State.FAILED:
            return
        record.move(State.FAILED, error=reason)
        self.counters.inc("failures_detected")
        log.warning("replica %s failed: %s", record.id, reason)
        try:
            self.save(record)
        except OsfleetError as exc:
            log.error("replica %s: could not record the failure: %s", record.id, exc)


def usable(record: ReplicaRecord) -> ReplicaRecord:
    """``record`` when its guest can be observed and acted on now. A failed or recovering replica raises
    ``ReplicaFailedError`` (an infrastructure failure: 503, never reward 0), any other state that is not ready or
    leased ``ReplicaBusyError`` (409). One rule for the real host and the API's fake (``tests/fakes.py``)."""
    if record.state in (State.FAILED, State.RECOVERING):
        raise ReplicaFailedError(f"replica {record.id} failed ({record.error}); it is being rebuilt")
    if record.state not in RUNNING_STATES:
        raise ReplicaBusyError(f"replica {record.id} is {record.state}")
    return record
