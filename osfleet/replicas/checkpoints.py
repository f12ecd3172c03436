"""Checkpoints: a running replica's state kept under a name its client chose, started again any number of times.

A checkpoint is a fork (``osfleet.replicas.forks``: the frozen disk layer, the RAM file or stream, the device
state) that a *name* keeps, not the replicas started from it: forks are collected once no replica uses them,
a checkpoint's fork stays until its client deletes the name. The record is one JSON file per checkpoint,
``<home>/checkpoints/<client key>/<name>.json``, written (by a rename) after its fork is complete, so a
checkpoint exists once its record does, and survives the host agent's restart as the fork's directory does.
Where the fork keeps its RAM on tmpfs, a sparse copy goes to its directory in the background, so a reboot
(which empties tmpfs) does not lose the checkpoint: the copy is put back the first time it is started.

Tenancy: the client key is a hash of the principal's name, and every lookup goes through the owner, so another
client's checkpoint is a 404 like a name that does not exist. Quotas are per client and per host: a number and
the bytes of disk layers and memory (``Settings.checkpoint_max_count`` / ``checkpoint_max_bytes``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from osfleet.errors import OsfleetError
from osfleet.protocol.models import CHECKPOINT_NAME_PATTERN
from osfleet.replicas.quota import SAVE_RETRY_AFTER_SECONDS, Refusals, refuse_count_past, refuse_past
from osfleet.replicas.saved_state import SavedState
from osfleet.vm import qcow2

# Letters, digits, ``.``, ``_`` and ``-``, 1..64 characters, not starting with a punctuation mark: a name is a
# file name on the host and a path segment in the API, so nothing that could climb out of either.
_NAME = re.compile(CHECKPOINT_NAME_PATTERN)
RECORD_SUFFIX = ".json"
DELETE = "delete one first"


class CheckpointNotFoundError(OsfleetError):
    """No checkpoint of that name for this client (another client's is not found either)."""


class CheckpointNameError(OsfleetError):
    """A name that cannot be a checkpoint's (a ``/``, over 64 characters...)."""


class CheckpointExistsError(OsfleetError):
    """The client already keeps a checkpoint of that name (delete it first)."""


class CheckpointQuotaError(OsfleetError):
    """One more checkpoint would pass the client's quota on this host (its number or bytes): 409 ``quota``, until
    the client deletes one (waiting does not free it)."""


class CheckpointTooLargeError(CheckpointQuotaError):
    """The checkpoint alone is larger than the client's whole quota of bytes on this host: 413, it can never fit."""


class CheckpointSavesPendingError(CheckpointQuotaError):
    """Only the client's own checkpoints being saved right now make this one pass its quota: 429 with
    ``retry_after``, since whether it fits is known once they end (a failed save frees its room)."""

    retry_after = SAVE_RETRY_AFTER_SECONDS


@dataclass(frozen=True)
class Checkpoint:
    """One kept state. ``stopped_at``: host time its replica stood still (a replica started from it moves its
    guest clock on from there); ``identity``: the saved replica's hostname and machine id (its copies keep them,
    as a fork's children do); ``task``: the episode's task then (so ``evaluate`` works on a copy)."""

    name: str
    owner: str
    fork_id: str
    image: str
    parent: str
    created_at: float
    stopped_at: float
    save_seconds: float
    disk_bytes: int
    memory_bytes: int
    identity: tuple[str, str]
    task: dict[str, Any] | None = None

    @property
    def bytes(self) -> int:
        return self.disk_bytes + self.memory_bytes


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise CheckpointNameError(
            f"checkpoint name {name[:80]!r} is not allowed: 1 to 64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit"
        )
    return name


def owner_key(owner: str) -> str:
    """A client's folder name: its principal's name may hold anything, its hash is a safe file name."""
    return hashlib.sha256(owner.encode()).hexdigest()[:24]


def fork_bytes(state: SavedState) -> tuple[int, int]:
    """(disk, memory) bytes a fork holds: its qcow2 layers as allocated, its resident RAM file, its stream and
    the RAM's copy on disk."""
    disk = sum(qcow2.allocated_bytes(p) for p in state.directory.glob("*.qcow2"))
    memory = 0
    ram = state.ram
    with contextlib.suppress(OSError):
        if ram is not None and ram.exists():
            memory += ram.stat().st_blocks * 512
    for extra in (state.memory, state.ram_copy):
        with contextlib.suppress(OSError):
            memory += extra.stat().st_blocks * 512
    return disk, memory


QUOTA_REFUSALS = Refusals(CheckpointQuotaError, CheckpointTooLargeError, CheckpointSavesPendingError)


class CheckpointBook:
    """The checkpoints of one host, by client. Thread-safe: names are reserved under one lock while a save runs,
    so two saves of one name (or past a quota) cannot both succeed."""

    def __init__(self, root: Path, max_count: int, max_bytes: int) -> None:
        self.root = root
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._reserved: dict[tuple[str, str], int] = {}  # (owner, name) -> bytes expected, while being saved

    def _path(self, owner: str, name: str) -> Path:
        return self.root / owner_key(owner) / f"{check_name(name)}{RECORD_SUFFIX}"

    def _records(self) -> Iterator[Path]:
        if self.root.exists():
            yield from sorted(self.root.glob(f"*/*{RECORD_SUFFIX}"))

    def all(self) -> list[Checkpoint]:
        """Every checkpoint of every client (the operator's view, and what keeps forks from being collected)."""
        out = []
        for path in self._records():
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                out.append(_load(path))
        return out

    def fork_ids(self) -> set[str]:
        """The forks a checkpoint keeps (``Forks.collect`` leaves them, and their RAM files, alone)."""
        return {c.fork_id for c in self.all()}

    def list(self, owner: str) -> list[Checkpoint]:
        return [c for c in self.all() if c.owner == owner]

    def get(self, owner: str, name: str) -> Checkpoint:
        """The owner's checkpoint ``name``; a name no checkpoint can have is not found either (a path segment of the
        API is any text: 404, as for any name the client does not keep)."""
        try:
            path = self._path(owner, name)
        except CheckpointNameError:
            raise CheckpointNotFoundError(f"no checkpoint named {name[:80]!r}") from None
        try:
            found = _load(path)
        except (OSError, ValueError, TypeError, KeyError):
            raise CheckpointNotFoundError(f"no checkpoint named {name!r}") from None
        if found.owner != owner:  # a hash collision is not a way into another client's checkpoint
            raise CheckpointNotFoundError(f"no checkpoint named {name!r}")
        return found

    @contextlib.contextmanager
    def reserving(self, owner: str, name: str, expected_bytes: int) -> Iterator[None]:
        """Hold ``name`` for ``owner`` while its checkpoint is saved: refuses a name the client keeps (or is
        saving) and a checkpoint past the client's quota, counting the ones being saved (``quota.refuse_past``:
        full, too large, or pending those saves)."""
        check_name(name)
        key = (owner, name)
        with self._lock:
            mine = self.list(owner)
            if key in self._reserved or any(c.name == name for c in mine):
                raise CheckpointExistsError(f"checkpoint {name!r} exists: delete it first or choose another name")
            pending = [b for (o, _), b in self._reserved.items() if o == owner]
            refuse_count_past(
                len(mine), len(pending), self.max_count, QUOTA_REFUSALS, what="checkpoint(s)", remedy=DELETE
            )
            refuse_past(
                sum(c.bytes for c in mine),
                sum(pending),
                expected_bytes,
                self.max_bytes,
                QUOTA_REFUSALS,
                holding="this client's checkpoints",
                limit=f"its quota of {self.max_bytes / 2**20:.0f} MiB",
                remedy=DELETE,
            )
            self._reserved[key] = expected_bytes
        try:
            yield
        finally:
            with self._lock:
                self._reserved.pop(key, None)

    def add(self, checkpoint: Checkpoint) -> None:
        """Write the record (the caller holds the name with ``reserving``): the checkpoint exists from here."""
        path = self._path(checkpoint.owner, checkpoint.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        tmp = path.with_name(f".{path.name}.tmp")
        data = asdict(checkpoint)
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.rename(path)

    def remove(self, owner: str, name: str) -> Checkpoint:
        """Forget the name; its fork goes with the next collection once no replica started from it uses it."""
        with self._lock:
            found = self.get(owner, name)
            self._path(found.owner, found.name).unlink(missing_ok=True)
        return found

    def remove_all(self) -> int:
        """Every record (``replicas down --all --states``: the saved states under every checkpoint go too)."""
        n = 0
        for path in self._records():
            path.unlink(missing_ok=True)
            n += 1
        return n


def _load(path: Path) -> Checkpoint:
    data = json.loads(path.read_text())
    data["identity"] = tuple(data["identity"])
    return Checkpoint(**data)


def new_checkpoint(
    name: str, owner: str, state: SavedState, identity: tuple[str, str], stopped_at: float, task: dict[str, Any] | None
) -> Checkpoint:
    """The record of a fork just saved for ``name``."""
    disk, memory = fork_bytes(state)
    return Checkpoint(
        name=name,
        owner=owner,
        fork_id=state.directory.name,
        image=str(state.meta.get("image", "")),
        parent=str(state.meta.get("parent", "")),
        created_at=time.time(),
        stopped_at=stopped_at,
        save_seconds=float(state.meta.get("save_seconds", 0.0)),
        disk_bytes=disk,
        memory_bytes=memory,
        identity=identity,
        task=task,
    )
