"""Replica records: each replica's state, disk layers, generation and lease, persisted on the host's disk.

One JSON file per replica, replaced atomically on every change, so a restarted process rebuilds its view
from these files plus libvirt; no central database, and one replica's record never touches another's.
"""

from __future__ import annotations

import json
import os
import time
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ValidationError

from osfleet.errors import OsfleetError
from osfleet.protocol.models import Mode


class State(StrEnum):
    PROVISIONING = "provisioning"
    BOOTING = "booting"
    READY = "ready"
    LEASED = "leased"
    RESETTING = "resetting"
    FAILED = "failed"
    RECOVERING = "recovering"
    RETIRED = "retired"


ALLOWED: dict[State, set[State]] = {
    State.PROVISIONING: {State.BOOTING, State.FAILED, State.RETIRED},
    State.BOOTING: {State.READY, State.FAILED, State.RETIRED},
    State.READY: {State.LEASED, State.RESETTING, State.FAILED, State.RETIRED},
    State.LEASED: {State.READY, State.RESETTING, State.FAILED, State.RETIRED},
    State.RESETTING: {State.READY, State.LEASED, State.FAILED, State.RETIRED},
    State.FAILED: {State.RECOVERING, State.RETIRED},
    State.RECOVERING: {State.READY, State.FAILED, State.RETIRED},
    State.RETIRED: set(),
}
# States in which a replica is being made or remade: a process that dies here leaves it half-made.
TRANSIENT_STATES = {State.PROVISIONING, State.BOOTING, State.RESETTING, State.RECOVERING}
RUNNING_STATES = {State.READY, State.LEASED}


class InvalidTransitionError(OsfleetError):
    """A replica was asked to move to a state its current state does not allow."""


class Lease(BaseModel):
    id: str
    holder: str  # free text the client chose (shown on the dashboard); not an identity
    expires_at: float
    owner: str = ""  # the client the lease belongs to (osfleet.api.auth.Principal.name); "" before tenants

    def expired(self, now: float | None = None) -> bool:
        return (now or time.time()) >= self.expires_at


class ReplicaRecord(BaseModel):
    """Everything needed to find, adopt or clean up one replica after a restart."""

    id: str
    image: str
    mode: Mode  # how the replica is brought up and reset
    state: State = State.PROVISIONING
    generation: int = 0
    domain: str = ""
    disk: str = ""  # the replica's own top overlay
    layers: list[str] = []  # read-only layers under it, nearest first
    lease: Lease | None = None
    hostname: str = ""
    machine_id: str = ""
    parked: bool = False  # ready and paused until leased (``Lifecycle.park_locked``)
    owner_pid: int = 0  # the process managing the replica; another process leaves it alone while it lives
    error: str | None = None
    created_at: float = 0.0
    ready_at: float | None = None  # first time the replica was ready: created_at..ready_at is its bring-up
    updated_at: float = 0.0

    def move(self, to: State, error: str | None = None) -> None:
        if to != self.state and to not in ALLOWED[self.state]:
            raise InvalidTransitionError(f"replica {self.id}: cannot go from {self.state} to {to}")
        self.state = to
        self.error = error if to in (State.FAILED, State.RECOVERING) else None
        self.updated_at = time.time()
        if to == State.READY and self.ready_at is None:
            self.ready_at = self.updated_at


class RecordStore:
    """Records as ``<dir>/<id>.json``; writes go to a temporary file that is renamed over the old one."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, replica_id: str) -> Path:
        return self.dir / f"{replica_id}.json"

    def save(self, record: ReplicaRecord) -> None:
        """Write the record atomically, exactly as given."""
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.path(record.id)
        tmp = target.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(record.model_dump_json(indent=2))
        with open(tmp) as f:
            os.fsync(f.fileno())
        tmp.replace(target)

    def load_all(self) -> tuple[list[ReplicaRecord], list[Path]]:
        """All readable records, and the paths of unreadable ones (left for the caller to clean)."""
        records: list[ReplicaRecord] = []
        broken: list[Path] = []
        if not self.dir.exists():
            return records, broken
        for path in sorted(self.dir.glob("*.json")):
            try:
                records.append(ReplicaRecord.model_validate(json.loads(path.read_text())))
            except (OSError, ValueError, ValidationError):
                broken.append(path)
        return records, broken

    def delete(self, replica_id: str) -> None:
        self.path(replica_id).unlink(missing_ok=True)


def owned_by_other_live_process(record: ReplicaRecord) -> bool:
    """True while another running process manages ``record`` (its host agent, a benchmark, a CLI call)."""
    pid = record.owner_pid
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
