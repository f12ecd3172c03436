"""A stand-in for ReplicaHost with no libvirt and no golden image, for API and concurrency unit tests.

mypy holds it to ``osfleet.api.host.AgentHost``, as it holds the real host (``HOST_PROTOCOL`` below).

Leases, records and the reset-after-release are the real ``Registry`` and ``LeaseBook``, and so is the lease
check under the replica's lock (``LeaseBook.touching``) that every call with a claim passes, as on a real host;
only what needs a guest is faked: a reset is instant, ``act`` records the actions it was given (``act_gate``
holds it, to race it), the screen is a blank image.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from osfleet.api.host import AgentHost
from osfleet.config import ReplicaShape, Settings
from osfleet.errors import GuestFileTooLargeError, OsfleetError
from osfleet.protocol.actions import Action, ActionResult
from osfleet.protocol.models import ImageFormat, Mode
from osfleet.replicas import guest_files
from osfleet.replicas.adoption import AdoptReport
from osfleet.replicas.checkpoints import Checkpoint, CheckpointBook
from osfleet.replicas.errors import (
    CapacityError,
    GuestFileConflictError,
    GuestFileNotFoundError,
    LeaseError,
    ReplicaBusyError,
)
from osfleet.replicas.forks import ForkInfo
from osfleet.replicas.leases import Claim, LeaseBook
from osfleet.replicas.lifecycle import Child, Forked, Timed
from osfleet.replicas.records import RUNNING_STATES, Lease, RecordStore, ReplicaRecord, State
from osfleet.replicas.registry import Counters, Registry, usable
from osfleet.replicas.tunnels import Stream, Tunnels
from osfleet.vm.screen import encode
from tests.fake_guest_channels import FakeGuestChannels


@dataclass
class FakeImage:
    name: str = "golden-fake"
    screen: tuple[int, int] = (64, 40)
    disk: Path = Path("/nonexistent/golden-fake.qcow2")


@dataclass
class FakeHost:
    """The façade the API uses, over real records on ``home`` and a fake guest."""

    home: Path
    ready: int = 1
    mode: Mode = "snapshot"
    image: FakeImage = field(default_factory=FakeImage)
    accel: str = "qemu"
    applied: list[tuple[str, list[Action]]] = field(default_factory=list)
    act_error: BaseException | None = None
    alive: bool = True
    files: dict[str, str] = field(default_factory=dict)
    max_replicas: int = 8
    rss: int = 300 * 2**20  # what each fake replica "uses", for placement
    shots: list[tuple[str, int | None]] = field(default_factory=list)  # (format, quality) of each screenshot
    forked: list[str] = field(default_factory=list)
    act_gate: threading.Event | None = None  # when set, ``act`` waits for it (under the replica's lock)
    desktop_files: dict[str, bytes] = field(default_factory=dict)  # the desktop's files (upload_file, download_file)
    folders: set[str] = field(default_factory=set)  # paths that are folders in the desktop
    acting: threading.Event = field(default_factory=threading.Event)  # set while an ``act`` is waiting at the gate
    shell_gate: threading.Event | None = None  # when set, ``shell`` (a task's check) waits for it, outside the lock
    shelling: threading.Event = field(default_factory=threading.Event)  # set while a ``shell`` waits at its gate

    def __post_init__(self) -> None:
        self.settings = Settings(home=self.home, libvirt_uri="test:///default")
        self.shape = ReplicaShape()  # what a fork or checkpoint is counted at (its memory) against the fork budget
        self.image.disk = self.home / "golden-fake.qcow2"
        self.image.disk.parent.mkdir(parents=True, exist_ok=True)
        self.image.disk.write_bytes(b"")
        self.registry = Registry(RecordStore(self.settings.replicas_dir))
        self.leases = LeaseBook(self.registry, self._reset_locked)
        self.checkpoints = CheckpointBook(self.settings.checkpoints_dir, 4, 64 * 2**20)
        # tunnels: the real host side and the guest's real relay, over UNIX sockets, to this machine's loopback
        self.guest_channels = FakeGuestChannels(self.home / "channels")
        self.tunnels = Tunnels(self.guest_channels, self.guest_channels.start)
        self.checkpoint_files: dict[str, dict[str, str]] = {}  # fork id -> the files it kept (the fake guest's)
        self.background = False
        self.closed = False
        self._lock = threading.Lock()

    @property
    def counters(self) -> Counters:
        return self.registry.counters

    @property
    def replica_proxy(self) -> str | None:
        return None  # the fake's replicas have no network

    # --- lifecycle ------------------------------------------------------------------------------------------
    def adopt(self) -> AdoptReport:
        report = AdoptReport()
        records, _ = self.registry.store.load_all()
        for rec in records:
            self.registry.add(rec)
            report.kept.append(rec.id)
        while len(self.registry.all()) < self.ready:
            self._make()
        return report

    def _make(self) -> str:
        replica_id = f"r-{uuid.uuid4().hex[:8]}"
        now = time.time()
        rec = ReplicaRecord(id=replica_id, image=self.image.name, mode=self.mode, created_at=now, updated_at=now)
        (self.settings.replicas_dir / replica_id).mkdir(parents=True, exist_ok=True)
        rec.move(State.BOOTING)
        rec.move(State.READY)
        rec.generation = 1
        self.registry.save(rec)
        self.registry.add(rec)
        return replica_id

    def start_background(self) -> None:
        self.background = True

    def close(self) -> None:
        self.closed = True

    def background_alive(self) -> bool:
        return self.alive

    # --- replicas -------------------------------------------------------------------------------------------
    def replicas(self) -> list[ReplicaRecord]:
        return self.registry.all()

    def get(self, replica_id: str) -> ReplicaRecord:
        return self.registry.get(replica_id)

    def _reset_locked(self, rec: ReplicaRecord, then: State | None = None) -> None:
        after = then or (State.LEASED if rec.state == State.LEASED else State.READY)
        rec.move(State.RESETTING)
        rec.generation += 1
        self.files.clear()
        rec.move(after)
        self.registry.save(rec)

    def reset(
        self, replica_id: str, mode: Mode | None = None, unless_pristine: bool = False, claim: Claim | None = None
    ) -> Timed:
        with self.leases.touching(replica_id, claim) as rec:
            if rec.state not in RUNNING_STATES:
                raise ReplicaBusyError(f"replica {replica_id} is {rec.state}")
            self._reset_locked(rec)
            return Timed(replica_id, rec.mode, 0.0, rec.generation)

    def retire(self, replica_id: str, claim: Claim | None = None) -> None:
        with self.leases.touching(replica_id, claim) as rec:
            rec.move(State.RETIRED)
            self.registry.store.delete(replica_id)
        self.registry.remove(replica_id)

    def up_async(self, count: int, mode: Mode | None = None) -> None:
        if len(self.registry.all()) + count > self.max_replicas:
            raise CapacityError(f"this host can take {self.max_replicas - len(self.registry.all())} more replica(s)")
        for _ in range(count):
            self._make()

    # --- leases ---------------------------------------------------------------------------------------------
    def lease(self, holder: str, seconds: float = 600.0, owner: str = "") -> tuple[ReplicaRecord, Lease]:
        return self.leases.lease(holder, seconds, owner)

    def check_lease(self, replica_id: str, lease_id: str, owner: str | None = None) -> ReplicaRecord:
        return self.leases.check(replica_id, lease_id, owner)

    def release(self, replica_id: str, lease_id: str, owner: str | None = None) -> bool:
        return self.leases.release(replica_id, lease_id, owner)

    # --- forks (the real ones are tested on real replicas in test_forks.py) ----------------------------------
    def fork(
        self,
        replica_id: str,
        children: int,
        lease_id: str | None = None,
        seconds: float = 600.0,
        claim: Claim | None = None,
    ) -> Forked:
        """Children are new records leased to the parent's holder, made under the parent's lock."""
        if len(self.registry.all()) + children > self.max_replicas:
            raise CapacityError(f"this host can take {self.max_replicas - len(self.registry.all())} more replica(s)")
        with self.leases.touching(replica_id, claim) as parent:
            if parent.lease is None or parent.lease.id != lease_id:
                raise LeaseError(f"lease {lease_id} does not hold replica {replica_id}")
            holder, owner = parent.lease.holder, parent.lease.owner
            made = []
            for _ in range(children):
                child = self._make()
                with self.registry.locked(child) as rec:
                    lease = self.leases.grant(rec, holder, seconds, owner)
                    self.registry.save(rec)
                    made.append(Child(rec.model_copy(deep=True), lease, 0.0))
        self.forked.append(replica_id)
        return Forked(replica_id, f"f-{uuid.uuid4().hex[:10]}", "template", 0.0, 0.0, made)

    def fork_states(self) -> list[ForkInfo]:
        return []

    # --- checkpoints: the real book (names, tenancy, quota); the kept "state" is the fake guest's files ----------
    def checkpoint(
        self,
        replica_id: str,
        name: str,
        owner: str,
        lease_id: str | None = None,
        claim: Claim | None = None,
        task: dict[str, Any] | None = None,
    ) -> Checkpoint:
        with self.checkpoints.reserving(owner, name, 16 * 2**20), self.leases.touching(replica_id, claim) as rec:
            if rec.lease is None or rec.lease.id != lease_id:
                raise LeaseError(f"lease {lease_id} does not hold replica {replica_id}")
            fork_id = f"f-{uuid.uuid4().hex[:10]}"
            self.checkpoint_files[fork_id] = dict(self.files)
            made = Checkpoint(
                name,
                owner,
                fork_id,
                self.image.name,
                replica_id,
                time.time(),
                time.time(),
                0.0,
                8 * 2**20,
                8 * 2**20,
                ("fake", "0" * 32),
                task,
            )
            self.checkpoints.add(made)
            return made

    def start_checkpoint(
        self, name: str, owner: str, count: int, holder: str, seconds: float = 600.0
    ) -> tuple[Checkpoint, list[Child]]:
        found = self.checkpoints.get(owner, name)
        if len(self.registry.all()) + count > self.max_replicas:
            raise CapacityError(f"this host can take {self.max_replicas - len(self.registry.all())} more replica(s)")
        made = []
        for _ in range(count):
            child = self._make()
            with self.registry.locked(child) as rec:
                lease = self.leases.grant(rec, holder, seconds, owner)
                self.registry.save(rec)
                made.append(Child(rec.model_copy(deep=True), lease, 0.0))
        return found, made

    def delete_checkpoint(self, name: str, owner: str) -> Checkpoint:
        gone = self.checkpoints.remove(owner, name)
        self.checkpoint_files.pop(gone.fork_id, None)
        return gone

    # --- guest ----------------------------------------------------------------------------------------------
    def _running(self, replica_id: str, rec: ReplicaRecord | None = None) -> ReplicaRecord:
        return usable(rec if rec is not None else self.get(replica_id))  # the real host's rule, failed included

    @contextmanager
    def _touching(self, replica_id: str, claim: Claim | None) -> Iterator[ReplicaRecord]:
        """As ``ReplicaHost``: with a claim, under the replica's lock once the claim holds; else no lock."""
        if claim is None:
            yield self._running(replica_id)
            return
        with self.leases.touching(replica_id, claim) as rec:
            yield self._running(replica_id, rec)

    def screenshot(
        self, replica_id: str, fmt: ImageFormat = "png", quality: int | None = None, claim: Claim | None = None
    ) -> bytes:
        with self._touching(replica_id, claim) as rec:
            self.shots.append((fmt, quality))
            return self.screen_of(rec, fmt, quality)

    def screen_of(self, rec: ReplicaRecord, fmt: ImageFormat, quality: int | None) -> bytes:
        return encode(Image.new("RGB", self.image.screen), fmt, quality)

    def act(self, replica_id: str, actions: list[Action], claim: Claim | None = None) -> list[ActionResult]:
        with self._touching(replica_id, claim):
            if self.act_gate is not None:
                self.acting.set()
                self.act_gate.wait(30)
            if self.act_error is not None:
                raise self.act_error
            with self._lock:
                self.applied.append((replica_id, actions))
            for a in actions:
                if a.type == "shell":
                    self.files[a.command] = "ran"  # type: ignore[union-attr]
            return [ActionResult(type=a.type, ok=True, seconds=0.0) for a in actions]

    def shell(
        self, replica_id: str, command: str, timeout: float, as_root: bool = False, claim: Claim | None = None
    ) -> dict[str, Any]:
        with self._touching(replica_id, claim):
            pass
        if self.shell_gate is not None:
            self.shelling.set()
            self.shell_gate.wait(30)
        if command.startswith("test -e"):
            return {"exit_code": 0, "stdout": "absent\n", "stderr": ""}
        out = "yes\n" if self.files else ""  # a shell action has run in this generation
        return {"exit_code": 0, "stdout": out, "stderr": ""}

    def rss_bytes(self, replica_id: str) -> int | None:
        return self.rss

    def read_file(
        self, replica_id: str, path: str, limit: int, timeout: float = 60.0, claim: Claim | None = None
    ) -> bytes:
        with self._touching(replica_id, claim):
            raise OsfleetError("no files in the fake guest")

    # --- tunnels: as ``ReplicaHost`` (the lease checked under the replica's lock, then the stream) -------------
    def open_tunnel(self, replica_id: str, port: int, claim: Claim | None = None) -> Stream:
        with self._touching(replica_id, claim) as rec:
            return self.tunnels.open(rec.id, rec.generation, claim.lease_id if claim else None, rec.domain, port)

    def tunnel(self, replica_id: str, tunnel_id: str, claim: Claim | None = None) -> Stream:
        with self._touching(replica_id, claim) as rec:
            return self.tunnels.get(tunnel_id, rec.id, rec.generation, claim.lease_id if claim else None)

    # --- files: the real path policy (guest_files.allowed_path) over a dict standing in for the desktop ---------
    def upload_file(self, replica_id: str, path: str, data: bytes, claim: Claim | None = None) -> None:
        path = guest_files.allowed_path(path)
        with self._touching(replica_id, claim):
            if path in self.folders:
                raise GuestFileConflictError(f"{path} is a folder")
            self.desktop_files[path] = data

    def download_file(self, replica_id: str, path: str, claim: Claim | None = None) -> bytes:
        path = guest_files.allowed_path(path)
        with self._touching(replica_id, claim):
            if path not in self.desktop_files:
                raise GuestFileNotFoundError(f"no file {path} in the desktop (or none the desktop user can see)")
            data = self.desktop_files[path]
            if len(data) > guest_files.MAX_DOWNLOAD_BYTES:
                raise GuestFileTooLargeError(f"{path} is over {guest_files.MAX_DOWNLOAD_BYTES} bytes")
            return data


# mypy (pyproject's ``files``) checks that FakeHost has every member the API uses, typed as the real host has it.
HOST_PROTOCOL: type[AgentHost] = FakeHost
