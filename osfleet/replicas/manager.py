"""The replicas of one host behind one façade: ``ReplicaHost`` is what the API, the CLI and benches use.

The work is done by parts that can be read and tested alone: ``Registry`` (records and per-replica locks),
``Generations`` (domains, overlays, standbys), ``Lifecycle`` (bring-up, reset, recovery, retirement),
``LeaseBook`` (leases, and the reset after each release), ``Monitor`` (failure detection with recovery
beside it), ``WarmPool`` and ``adoption``. Nothing here touches a domain or file without this host's prefix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import OsfleetError
from osfleet.measure.timing import stage
from osfleet.protocol.actions import Action, ActionResult
from osfleet.protocol.models import FORMATS, MODES, ImageFormat, Mode
from osfleet.replicas import adoption, guest_files, network, saved_state, template_memory
from osfleet.replicas.actions import GUEST_USER, READ_FILE_SECONDS, read_file, run_actions, shell
from osfleet.replicas.adoption import AdoptReport, teardown_all
from osfleet.replicas.capture import ScreenCapture
from osfleet.replicas.checkpoints import Checkpoint, CheckpointBook, CheckpointNotFoundError, new_checkpoint
from osfleet.replicas.errors import (
    CapacityError,
    LeaseError,
    NoReplicaAvailableError,
    ReplicaBusyError,
    ReplicaFailedError,
    ReplicaNotFoundError,
)
from osfleet.replicas.forks import ForkInfo, Forks, image_changed
from osfleet.replicas.generations import Generations
from osfleet.replicas.leases import DEFAULT_LEASE_SECONDS, Claim, LeaseBook
from osfleet.replicas.lifecycle import Child, Forked, Lifecycle, Timed
from osfleet.replicas.liveness import Liveness
from osfleet.replicas.monitor import Monitor
from osfleet.replicas.pool import WarmPool
from osfleet.replicas.records import Lease, RecordStore, ReplicaRecord, State
from osfleet.replicas.registry import Counters, Registry, usable
from osfleet.replicas.saved_state import SavedState
from osfleet.replicas.template_memory import MemoryMode
from osfleet.replicas.tunnels import Stream, Tunnels
from osfleet.vm.accel import detect_accelerator
from osfleet.vm.images import GoldenImage, ImageHold
from osfleet.vm.virt import Virt

log = logging.getLogger(__name__)

# Host memory per replica assumed when no maximum is configured, and memory kept for the host itself.
# Measured (notes, ``bench density``/``bench reset``): ~270 MiB with its spare where every restore copies
# the whole stream; ~65 MiB with template memory, plus ~50 MiB for its restored spare.
ESTIMATED_REPLICA_BYTES = 350 * 2**20
ESTIMATED_TEMPLATE_REPLICA_BYTES = 160 * 2**20
HOST_RESERVE_BYTES = 2 * 2**30

__all__ = [
    "AdoptReport",
    "CapacityError",
    "LeaseError",
    "NoReplicaAvailableError",
    "ReplicaBusyError",
    "ReplicaHost",
    "ReplicaNotFoundError",
    "Timed",
    "teardown_all",
]


def default_max_replicas(per_replica_bytes: int = ESTIMATED_REPLICA_BYTES) -> int:
    """How many replicas this host's memory can hold, by the measured footprint (at least 1)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, (total - HOST_RESERVE_BYTES) // per_replica_bytes)


def footprint(settings: Settings, shape: ReplicaShape, mode: Mode, memory: MemoryMode | None) -> int:
    """The memory one replica is assumed to need here: small where snapshot replicas share template RAM."""
    if mode != "snapshot" or memory == "stream":
        return ESTIMATED_REPLICA_BYTES
    if template_memory.unavailable(settings.memory_dir, shape.memory_mib * 2**20) is not None:
        return ESTIMATED_REPLICA_BYTES
    return ESTIMATED_TEMPLATE_REPLICA_BYTES


class ReplicaHost:
    """All replicas of one image on this host. Thread-safe; one instance per host agent process."""

    def __init__(
        self,
        image: GoldenImage,
        settings: Settings | None = None,
        shape: ReplicaShape | None = None,
        mode: Mode = "snapshot",
        warm: int = 0,
        auto_recover: bool = True,
        say: Callable[[str], None] | None = None,
        max_replicas: int | None = None,
        memory: MemoryMode | None = None,
        spares: bool = True,
        park: bool = False,
        fork_ready: int | None = None,
    ) -> None:
        """``park``: ready replicas wait paused until leased (no CPU while idle; a lease resumes one in a
        fraction of a second). ``spares``: see ``Generations``. ``fork_ready``: children's domains kept
        started for the next fork (``osfleet.replicas.forks``; default ``Settings.fork_ready``)."""
        if mode not in MODES:
            raise OsfleetError(f"unknown reset mode {mode!r} (cold or snapshot)")
        self.image = image
        self.settings = settings or Settings.from_env()
        self.shape = shape or image.shape
        # The opt-in replica network: the bridge and its firewall exist before any domain names the bridge.
        self.network = network.NetworkPolicy.parse(self.settings.replica_network, self.settings.replica_subnet)
        self.addresses: network.AddressBook | None = None
        if self.network.enabled:
            bridge = network.setup(self.network, self.settings.name_prefix)
            self.shape = dataclasses.replace(self.shape, network_bridge=bridge)
            self.addresses = network.AddressBook(self.settings.network_dir, self.network)
            # setup() made the port rules anew (empty): the replicas of an earlier run keep their bindings
            network.apply_bindings(self.settings.name_prefix, self.addresses.bindings())
        self.mode: Mode = mode
        self.warm = warm
        self.max_replicas = max_replicas or default_max_replicas(footprint(self.settings, self.shape, mode, memory))
        self.say = say or log.info
        self.virt = Virt(self.settings.libvirt_uri)
        self.tunnels = Tunnels(self.virt)
        self.accel = detect_accelerator(image.kernel, self.settings)
        self.registry = Registry(RecordStore(self.settings.replicas_dir))
        self.generations = Generations(
            self.virt, image, self.accel, self.shape, self.settings, self.say, memory=memory, spares=spares
        )
        self.liveness = Liveness(self.virt)
        memory_dir = self.settings.memory_dir
        self.capture = ScreenCapture(self.virt, memory_dir / "screens" if memory_dir is not None else None)
        self.checkpoints = CheckpointBook(
            self.settings.checkpoints_dir, self.settings.checkpoint_max_count, self.settings.checkpoint_max_bytes
        )
        self.forks = Forks(
            self.virt,
            image,
            self.accel,
            self.shape,
            self.settings,
            capture=self.capture,
            saved=self.generations.saved,
            ready=self.settings.fork_ready if fork_ready is None else fork_ready,
            kept=self.checkpoints.fork_ids,
        )
        self.lifecycle = Lifecycle(
            self.registry,
            self.generations,
            mode,
            self.liveness,
            on_lease_lost=lambda lid, why: self.leases.note_lost(lid, why),
            forks=self.forks,
            park=park,
        )
        self.leases = LeaseBook(
            self.registry, lambda rec, then: self.lifecycle.reset_locked(rec, then=then), self.lifecycle.unpark_locked
        )
        self.monitor = Monitor(
            detect=self.lifecycle.detect,
            recover=self.lifecycle.recover if auto_recover else None,
            expired=self.leases.expired_leases,
            expire=self.leases.release,
        )
        self.pool = WarmPool(warm, self._coming, self.create)
        self._provisioner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osfleet-provision")
        self._background = False
        # Replicas promised to operations under way (a fork's children) but not registered yet: counted
        # with the registered ones, so two forks (or a fork and bring-ups) cannot both take the last room.
        self._capacity = threading.Lock()
        self._reserved = 0
        self.forks.prepare()  # the next fork's slots, if any are wanted (in the background)
        self._adopted: set[str] = set()
        # Until ``close``: a build or publish of this image's name stops rather than replace it under this host.
        self.image_hold = ImageHold(image)

    # --- lifecycle of the host object ----------------------------------------------------------------------
    def close(self) -> None:
        """Stop background work and let go of libvirt; every step runs even if an earlier one fails."""
        steps: list[Callable[[], None]] = [
            self.stop_background,
            lambda: self._provisioner.shutdown(wait=True, cancel_futures=True),
            self.forks.close,
            self.generations.close,
            self.liveness.close,
            self.tunnels.shutdown,
            self.capture.close,
            self.virt.close,
            self.image_hold.release,
        ]
        for step in steps:
            try:
                step()
            except Exception:
                log.exception("closing the replica host")

    def __enter__(self) -> ReplicaHost:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start_background(self) -> None:
        """Watch replicas for failures and expired leases, and keep the warm pool filled."""
        self.monitor.start()
        self.pool.start()
        self._background = True

    def stop_background(self) -> None:
        if self._background:
            self.pool.stop()
            self.monitor.stop()
            self._background = False

    def background_alive(self) -> bool:
        """False when a background thread that should run has died (``/health`` then fails)."""
        return not self._background or (self.monitor.alive() and self.pool.alive())

    def settle(self) -> None:
        self.generations.settle()
        self.forks.wait_ready()

    @property
    def counters(self) -> Counters:
        return self.registry.counters

    # --- records -------------------------------------------------------------------------------------------
    def get(self, replica_id: str) -> ReplicaRecord:
        return self.registry.get(replica_id)

    def replicas(self) -> list[ReplicaRecord]:
        return self.registry.all()

    def replica_dir(self, replica_id: str) -> Path:
        return self.generations.replica_dir(replica_id)

    def saved(self) -> saved_state.SavedState:
        return self.generations.saved()

    def _coming(self) -> int:
        """Replicas that are, or are about to be, ready and unleased: what the warm pool counts."""
        coming = (State.READY, State.BOOTING, State.PROVISIONING)
        return sum(1 for r in self.replicas() if r.state in coming or (r.state == State.RESETTING and r.lease is None))

    # --- bring-up, reset, recovery, retirement -------------------------------------------------------------
    def create(self, mode: Mode | None = None) -> Timed:
        with self.reserve(1):
            return self.lifecycle.create(mode)

    @contextlib.contextmanager
    def reserve(self, count: int) -> Iterator[None]:
        """Room for ``count`` more replicas, held while they are made (checked and taken atomically)."""
        with self._capacity:
            room = self.max_replicas - len(self.replicas()) - self._reserved
            if count > room:
                raise CapacityError(
                    f"this host can take {max(room, 0)} more replica(s) (maximum {self.max_replicas}); "
                    f"asked for {count}"
                )
            self._reserved += count
        try:
            yield
        finally:
            with self._capacity:
                self._reserved -= count

    def up(self, count: int, mode: Mode | None = None) -> list[Timed]:
        return [self.create(mode) for _ in range(count)]

    def up_async(self, count: int, mode: Mode | None = None) -> None:
        """Bring up ``count`` replicas in the background (one at a time: bring-ups compete for CPU)."""
        room = self.max_replicas - len(self.replicas())
        if count > room:
            raise CapacityError(
                f"this host can take {max(room, 0)} more replica(s) (maximum {self.max_replicas}); asked for {count}"
            )
        for _ in range(count):
            self._provisioner.submit(self._create_quietly, mode)

    def _create_quietly(self, mode: Mode | None) -> None:
        try:
            self.create(mode)
        except OsfleetError as exc:
            self.say(f"bring-up failed: {exc}")

    def reset(
        self, replica_id: str, mode: Mode | None = None, unless_pristine: bool = False, claim: Claim | None = None
    ) -> Timed:
        timed = self.lifecycle.reset(replica_id, mode, unless_pristine, check=self._checker(claim))
        self._network_up(replica_id)  # a reset restores the saved state's NIC: give it this replica's address
        return timed

    @property
    def replica_proxy(self) -> str | None:
        """The proxy replicas reach the web through (``--replica-network proxy=URL``), or None."""
        return self.network.proxy_url if self.network.mode == "proxy" else None

    def _network_up(self, replica_id: str) -> None:
        """With the replica network on, give the guest its own MAC, address, route, DNS (and proxy)."""
        if self.addresses is None:
            return
        address = self.addresses.assign(replica_id)
        assert self.shape.network_bridge is not None
        port = network.port_name(self.shape.network_bridge, self.get(replica_id).domain)
        network.apply_bindings(self.settings.name_prefix, self.addresses.bind(replica_id, port))
        command = network.guest_config_command(address, self.network, network.host_nameservers())
        out = self.shell(replica_id, command, 30, as_root=True)
        if out["exit_code"] != 0:
            raise ReplicaFailedError(f"replica {replica_id}: its network could not be set: {out['stderr'][-200:]}")

    def check(self) -> list[str]:
        """Detect failed replicas now (the monitor does this every second); returns ids due for recovery."""
        return self.lifecycle.detect()

    def recover(self, replica_id: str) -> Timed:
        return self.lifecycle.recover(replica_id)

    def retire(self, replica_id: str, claim: Claim | None = None) -> None:
        self.lifecycle.retire(replica_id, check=self._checker(claim))
        if self.addresses is not None:
            network.apply_bindings(self.settings.name_prefix, self.addresses.release(replica_id))

    def _checker(self, claim: Claim | None) -> Callable[[ReplicaRecord], None] | None:
        """``claim`` as a check that the lifecycle runs under the replica's lock."""
        if claim is None:
            return None
        return lambda rec: self.leases.check_locked(rec, claim)

    def down(self, ids: list[str] | None = None) -> int:
        """Retire the given replicas (all when None) in parallel; returns how many."""
        targets = ids if ids is not None else [r.id for r in self.replicas()]
        self.settle()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(self.retire, targets))
        return len(targets)

    def adopt(self) -> AdoptReport:
        report = adoption.adopt(self.registry, self.generations)
        self.lifecycle.collect_forks()  # forks whose children did not survive the restart
        self._adopted.update(r.id for r in self.replicas())
        return report

    def made_here(self) -> list[str]:
        """Every replica this object brought up, or was bringing up, and has not retired (not those it adopted):
        what a command tears down on its way out, interrupted or not: a list of ids a caller appends to after
        each ``create`` misses the one an interrupt caught halfway."""
        return [r.id for r in self.replicas() if r.id not in self._adopted]

    # --- forks ---------------------------------------------------------------------------------------------
    def fork(
        self,
        replica_id: str,
        children: int,
        lease_id: str | None = None,
        seconds: float = DEFAULT_LEASE_SECONDS,
        claim: Claim | None = None,
    ) -> Forked:
        """Save a running replica mid-episode and bring up ``children`` replicas from it on this host.

        With ``lease_id`` (the API: only the lease holder forks) each child is leased to the parent's holder;
        without it (the command line, an unleased replica) children are left ready."""
        grant = None
        if lease_id is not None:
            held = self.get(replica_id).lease
            who, owner = (held.holder, held.owner) if held is not None else ("", "")
            grant = lambda rec: self.leases.grant(rec, who, seconds, owner)  # noqa: E731
        with self.reserve(children):  # children counted from here until they are registered (or failed)
            forked = self.lifecycle.fork(replica_id, children, lease_id, grant, check=self._checker(claim))
        for child in forked.children:  # a child restores its parent's NIC: its own address, or it sends nothing
            self._network_up(child.record.id)
        return forked

    def fork_states(self) -> list[ForkInfo]:
        """Saved forks with how many replicas use each (their reference count) and their disk and memory."""
        return self.forks.info(self.replicas())

    # --- checkpoints ---------------------------------------------------------------------------------------
    def checkpoint(
        self,
        replica_id: str,
        name: str,
        owner: str,
        lease_id: str | None = None,
        claim: Claim | None = None,
        task: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Keep the running replica's state (memory and disk) under ``name`` for ``owner``; the replica goes on.
        Refused (before anything is saved) for a name the owner keeps already or past the owner's quota."""
        expected = self.shape.memory_mib * 2**20  # at most its RAM, plus a disk layer of what it wrote
        kept: list[Checkpoint] = []

        def keep(state: SavedState, identity: tuple[str, str], stopped_at: float) -> None:
            made = new_checkpoint(name, owner, state, identity, stopped_at, task)
            self.checkpoints.add(made)
            kept.append(made)

        with self.checkpoints.reserving(owner, name, expected):
            state = self.lifecycle.checkpoint(replica_id, lease_id, keep, check=self._checker(claim))
        if state.ram is not None:  # a reboot empties tmpfs: keep the RAM's copy on disk too, off the request
            self._provisioner.submit(_copy_ram, state, self.virt.qemu_ids())
        return kept[0]

    def start_checkpoint(
        self, name: str, owner: str, count: int, holder: str, seconds: float = DEFAULT_LEASE_SECONDS
    ) -> tuple[Checkpoint, list[Child]]:
        """Bring up ``count`` replicas at exactly the checkpoint's state, each leased to ``holder`` (``owner``'s)."""
        found = self.checkpoints.get(owner, name)
        if found.image != self.image.name:
            raise CheckpointNotFoundError(
                f"checkpoint {name!r} was saved from image {found.image}; this host serves {self.image.name}"
            )
        state = self.forks.load(found.fork_id)
        if (refused := image_changed(state, f"checkpoint {name!r}", "delete it")) is not None:
            raise refused  # never restored over other bytes, nor deleted for its client
        if state.ram is not None and not state.ram.exists():  # tmpfs emptied by a reboot: put the RAM back
            if not state.ram_copy.exists():
                raise OsfleetError(f"checkpoint {name!r} lost its memory with a reboot (no copy on disk)")
            template_memory.put_back(state.ram_copy, state.ram, self.virt.qemu_ids())
            template_memory.claim(state.ram, state.directory)
        grant = lambda rec: self.leases.grant(rec, holder, seconds, owner)  # noqa: E731
        with self.reserve(count):
            children = self.lifecycle.start_from(state, count, grant, found.identity, found.stopped_at)
        for child in children:
            self._network_up(child.record.id)
        return found, children

    def delete_checkpoint(self, name: str, owner: str) -> Checkpoint:
        """Forget the name; its files go once no replica started from it still uses them."""
        found = self.checkpoints.remove(owner, name)
        self.lifecycle.collect_forks()
        return found

    # --- leases --------------------------------------------------------------------------------------------
    def lease(
        self, holder: str, seconds: float = DEFAULT_LEASE_SECONDS, owner: str = ""
    ) -> tuple[ReplicaRecord, Lease]:
        rec, lease = self.leases.lease(holder, seconds, owner)
        self._network_up(rec.id)
        return rec, lease

    def check_lease(self, replica_id: str, lease_id: str, owner: str | None = None) -> ReplicaRecord:
        return self.leases.check(replica_id, lease_id, owner)

    def release(self, replica_id: str, lease_id: str, owner: str | None = None) -> bool:
        """End a lease; the replica is reset before anyone else can lease it. True when it is ready again."""
        return self.leases.release(replica_id, lease_id, owner)

    # --- observe and act -----------------------------------------------------------------------------------
    # With a claim, each call happens under the replica's lock once the claim is found to hold it (see
    # ``LeaseBook.touching``); without one (the command line, the dashboard's thumbnails) it takes no lock.
    def _running(self, replica_id: str, rec: ReplicaRecord | None = None) -> ReplicaRecord:
        return usable(rec if rec is not None else self.get(replica_id))

    @contextmanager
    def _touching(self, replica_id: str, claim: Claim | None) -> Iterator[ReplicaRecord]:
        if claim is None:
            yield self._running(replica_id)
            return
        with self.leases.touching(replica_id, claim) as rec:
            yield self._running(replica_id, rec)

    def screenshot(
        self, replica_id: str, fmt: ImageFormat = "png", quality: int | None = None, claim: Claim | None = None
    ) -> bytes:
        """The replica's screen as PNG, JPEG or WebP (``quality`` 1..100 for the last two; default 85)."""
        if fmt not in FORMATS:
            raise OsfleetError(f"unknown screenshot format {fmt!r} (png, jpeg or webp)")
        with self._touching(replica_id, claim) as rec:
            frame = self.capture.take(rec.domain)
        return frame.encode(fmt, quality)  # outside the lock; only the rows that changed (``capture``)

    def act(self, replica_id: str, actions: list[Action], claim: Claim | None = None) -> list[ActionResult]:
        with self._touching(replica_id, claim) as rec:
            self.lifecycle.mark_used(rec.id, rec.generation)
            with stage("act"):
                return run_actions(
                    self.virt,
                    rec.domain,
                    self.image.screen,
                    actions,
                    capture=lambda: self.capture.grab(rec.domain),
                    screen_state=lambda: self.capture.take(rec.domain).fingerprint,
                )

    def shell(
        self, replica_id: str, command: str, timeout: float, as_root: bool = False, claim: Claim | None = None
    ) -> dict[str, Any]:
        """Run a shell command in the replica's guest (task set-up and verifiers)."""
        with self._touching(replica_id, claim) as rec:
            self.lifecycle.mark_used(rec.id, rec.generation)
            return shell(self.virt, rec.domain, command, timeout, as_root)

    def read_file(
        self, replica_id: str, path: str, limit: int, timeout: float = READ_FILE_SECONDS, claim: Claim | None = None
    ) -> bytes:
        """The whole guest file (task checks and getters), within ``timeout`` seconds; a file larger than
        ``limit`` raises ``GuestFileTooLargeError`` (scored 0 by the runner), never comes back cut short."""
        with self._touching(replica_id, claim) as rec:
            return read_file(self.virt, rec.domain, path, limit, timeout, whole=True)

    def upload_file(self, replica_id: str, path: str, data: bytes, claim: Claim | None = None) -> None:
        """Write a client's file into the desktop as the desktop user (``guest_files``: ``path`` is checked first)."""
        path = guest_files.allowed_path(path)
        with self._touching(replica_id, claim) as rec:
            self.lifecycle.mark_used(rec.id, rec.generation)
            guest_files.upload(self.virt, rec.domain, GUEST_USER, path, data)

    def download_file(self, replica_id: str, path: str, claim: Claim | None = None) -> bytes:
        """A file of the desktop read as the desktop user, whole (over ``guest_files.MAX_DOWNLOAD_BYTES``: 413)."""
        path = guest_files.allowed_path(path)
        with self._touching(replica_id, claim) as rec:
            self.lifecycle.mark_used(rec.id, rec.generation)  # the user's copy ran in its guest
            return guest_files.download(self.virt, rec.domain, GUEST_USER, path)

    def open_tunnel(self, replica_id: str, port: int, claim: Claim | None = None) -> Stream:
        """A byte stream to ``127.0.0.1:port`` inside the replica, as the desktop user (``tunnels``)."""
        with self._touching(replica_id, claim) as rec:
            self.lifecycle.mark_used(rec.id, rec.generation)  # a program in its guest saw a connection
            return self.tunnels.open(rec.id, rec.generation, claim.lease_id if claim else None, rec.domain, port)

    def tunnel(self, replica_id: str, tunnel_id: str, claim: Claim | None = None) -> Stream:
        """The open stream ``tunnel_id`` of the replica's current generation; the lease is checked under the
        replica's lock, the stream's reads and writes happen outside it (a long wait never holds a step up)."""
        with self._touching(replica_id, claim) as rec:
            return self.tunnels.get(tunnel_id, rec.id, rec.generation, claim.lease_id if claim else None)

    def rss_bytes(self, replica_id: str) -> int | None:
        return self.virt.rss_bytes(self.get(replica_id).domain)


def _copy_ram(state: SavedState, owner: tuple[int, int] | None) -> None:
    """The sparse copy of a checkpoint's RAM file beside its disk layers (``SavedState.ram_copy``)."""
    assert state.ram is not None
    tmp = state.ram_copy.with_name(f".{state.ram_copy.name}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        template_memory.copy_sparse(state.ram, tmp)
        tmp.rename(state.ram_copy)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.warning("checkpoint %s: no copy of its RAM on disk (%s); a reboot would lose it", state.directory, exc)
