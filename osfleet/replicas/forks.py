"""Forks: a running replica saved mid-episode, so any number of children start exactly where it was.

Saving. The parent is saved by a *live* (pre-copy) migration into a file on tmpfs: QEMU streams its
memory while the guest runs on, then stops it only for the pages dirtied meanwhile (the downtime limit is
set low, the bandwidth high: a file takes what it is given). While it stands still its overlay is copied
as the fork's frozen disk layer (sparse, in-process) and its screen is dumped; then it goes on. It stands
still ~0.1 s, where streaming 512 MiB from a paused guest took 1.5-2 s.

Where this host has template memory the stream is then loaded once into a *fork template*: a paused
domain whose RAM is a new file on tmpfs (``share=on``), on an overlay over the frozen layer. Its device
state is saved with ``x-ignore-shared``, as a saved state's is, so every child maps that RAM file
privately and loads a few MiB of device state instead of the parent's whole memory. The fork template is
never resumed: QEMU activates its disks when the incoming stream ends and inactivates them again when the
outgoing one ends, so nothing the guest did is missing from the frozen layers. Without template memory
(or when the parent runs on anonymous RAM, a cold-booted replica) children load the parent's full stream.

Ready slots (``fork_ready`` > 0): a child then starts the way a reset starts from a spare. Starting a
domain costs ~0.4 s of libvirt and QEMU here, so the next fork's domains are started ahead of time, in
the background, paused and waiting for their stream: its fork template and ``fork_ready`` children,
each mapping the next fork's RAM file (still empty: a paused QEMU that waits for a stream never touches
guest RAM) on disk chains through the next fork's layer files, which exist from the start as empty
overlays with the right backing. At the fork the parent's overlay is copied *into* the frozen layer's
existing file, the template fills the RAM file, and each slot only loads the device state and runs
(~60 ms). QEMU re-reads every image's metadata when a stream ends and its disks become active (the
mechanism of migration over shared storage), so a chain opened before its files had their content is
read correctly. Slots fit parents whose chain is the image's saved state (a plain replica); a child of a
child, or a fork bigger than the slots, starts its other children the ordinary way.

Identity: a child is an exact copy of its parent (hostname and machine id, recorded as such) with one
difference: a new VM generation ID, on which the guest kernel reseeds its random number generator before
any program of the child runs. A GRPO group wants exact copies, and setting a hostname would cost a
round trip to the helper in a guest whose translated code is all cold (~0.2 s). The child's clock is
moved forward by the time since the parent stopped through its resident helper, without waiting: the
adjustment is relative, so it is right whenever the helper gets to run.

A fork is a directory under ``Settings.forks_dir`` (frozen disk layers, the stream, ``meta.json`` written
last) plus, in template mode, its RAM file. Its disk is needed while any replica's chain goes through it
(children of children keep their ancestors' layers); its RAM file only while a replica maps it, i.e.
runs a generation made from that fork (a child not reset since). ``collect`` removes forks no replica
uses and RAM files no replica maps, so a chain of forks keeps one RAM file, not one per ancestor.
Limits: ``Settings.fork_max_depth`` forks in one chain and ``Settings.fork_max_bytes`` of saved forks.
A checkpoint (``osfleet.replicas.checkpoints``) is a fork kept by a name: ``kept`` forks are never collected.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.replicas import guest_control, saved_state, template_memory
from osfleet.replicas.capture import ScreenCapture
from osfleet.replicas.errors import CapacityError, ForkTooDeepError, StateImageChangedError
from osfleet.replicas.records import ReplicaRecord
from osfleet.replicas.saved_state import IGNORE_SHARED, SavedState
from osfleet.replicas.spec import replica_spec
from osfleet.vm import qcow2
from osfleet.vm.domain_xml import Accel, MemoryFile
from osfleet.vm.images import GoldenImage
from osfleet.vm.tenant_storage import private_dir, shared_layer
from osfleet.vm.virt import Virt, VirtError

log = logging.getLogger(__name__)

META = "meta.json"
PARENT_DISK = "parent.qcow2"
SCREEN = "screen.png"
NO_IGNORE_SHARED = [{"capability": "x-ignore-shared", "state": False}]
# The backend id osfleet gives file-backed guest RAM (``domain_xml.MemoryFile``).
RAM_OBJECT = "/objects/osfleet-ram"
# A fork directory without meta.json this old was left by a process that died while saving it.
UNFINISHED_AGE_SECONDS = 600.0
# Live save: a file takes the stream as fast as it comes; the guest stops for what is left once QEMU
# expects it to take less than this.
LIVE_BANDWIDTH_BYTES = 8 * 2**30
DOWNTIME_LIMIT_MS = 50
COPY_CHUNK = 8 * 2**20


@dataclass(frozen=True)
class ForkInfo:
    """One saved fork as ``/v1/host`` and ``/metrics`` show it."""

    id: str
    parent: str
    memory_mode: str
    children: int  # replicas whose disk chain still uses it (its reference count)
    disk_bytes: int
    memory_bytes: int  # RAM file resident on tmpfs (template mode) + the stream file


@dataclass(frozen=True)
class Slot:
    """A child's domain started ahead of time, waiting for the device state of the fork it belongs to."""

    replica_id: str
    domain: str
    disk: Path


@dataclass
class _Batch:
    """The next fork's files and domains, made ahead of time (see the module docstring)."""

    fork_id: str
    directory: Path
    ram: Path
    template: str
    base_layers: list[str]  # the parent chain these slots fit (the image's saved state)
    slots: list[Slot] = field(default_factory=list)


@dataclass(frozen=True)
class Saved:
    """A fork just saved: its state, the ready slots its children take first, and when the parent stopped."""

    state: SavedState
    slots: list[Slot]
    stopped_at: float  # host time (time.time()) when the parent stopped: children's clocks move on from it


class Forks:
    """Saved forks of this host's replicas; thread-safe (forks being saved are pinned until their
    children are registered, so ``collect`` never removes one under a fork in progress)."""

    def __init__(
        self,
        virt: Virt,
        image: GoldenImage,
        accel: Accel,
        shape: ReplicaShape,
        settings: Settings,
        capture: ScreenCapture | None = None,
        saved: Callable[[], SavedState] | None = None,
        ready: int = 0,
        kept: Callable[[], set[str]] | None = None,
    ) -> None:
        """``saved``: the image's saved state (slots are made on its chain); ``ready``: how many child
        slots to keep started ahead of time (0: none, every child starts its own domain); ``kept``: the forks
        something other than a replica keeps (checkpoints): never collected, their RAM files never released."""
        self.virt = virt
        self.image = image
        self.accel = accel
        self.shape = shape
        self.settings = settings
        self.capture = capture or ScreenCapture(virt, None)
        self._saved = saved
        self.ready = ready
        self._kept = kept or set
        self._pinned: set[str] = set()
        self._lock = threading.Lock()
        self._batch: _Batch | None = None
        self._preparing: Future[None] | None = None
        self._prep = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osfleet-fork-slots")
        self._closing = threading.Event()

    @property
    def root(self) -> Path:
        return self.settings.forks_dir

    # --- limits ------------------------------------------------------------------------------------------------
    def depth(self, rec: ReplicaRecord) -> int:
        """How many forks the replica's disk chain goes through (0: a replica of the image)."""
        return len({Path(p).parent.name for p in rec.layers if Path(p).parent.parent == self.root})

    def check_limits(self, parent: ReplicaRecord, records: Iterable[ReplicaRecord]) -> None:
        """Refuse a fork that would go deeper than ``fork_max_depth`` or past ``fork_max_bytes`` of saved
        forks (counting the new one at the parent's memory size)."""
        depth = self.depth(parent) + 1
        if depth > self.settings.fork_max_depth:
            raise ForkTooDeepError(
                f"replica {parent.id} is {depth - 1} fork(s) deep; forks go at most "
                f"{self.settings.fork_max_depth} deep on this host (fork its ancestor instead)"
            )
        used = sum(f.disk_bytes + f.memory_bytes for f in self.info(records))
        new = self.shape.memory_mib * 2**20
        if used + new > self.settings.fork_max_bytes:
            raise CapacityError(
                f"saved forks hold {used >> 20} MiB here; another one ({new >> 20} MiB) would pass the host's "
                f"limit of {self.settings.fork_max_bytes >> 20} MiB: release forked replicas first"
            )

    # --- saving ------------------------------------------------------------------------------------------------
    def save(self, parent: ReplicaRecord) -> Saved:
        """Save the running replica ``parent`` (whose lock the caller holds) as a new fork, pinned until
        ``unpin``. The parent stands still only for its last dirty pages and its overlay's copy."""
        batch = self._take_batch(parent)
        fork_id = batch.fork_id if batch else f"f-{uuid.uuid4().hex[:10]}"
        directory = batch.directory if batch else self.root / fork_id
        with self._lock:
            self._pinned.add(fork_id)
        ram: Path | None = batch.ram if batch else None
        stream = self._stream_path(fork_id, directory)
        try:
            if batch is None:
                self.root.mkdir(parents=True, exist_ok=True)
                directory.mkdir()
                private_dir(directory, self.virt.qemu_ids())  # a tenant's disk and memory
            disks = self.image_disks(parent)  # before the parent pauses: a chain that lost a layer is refused
            started = time.monotonic()
            mapped = self._ram_file(parent.domain)
            paused, stopped_at = self._live_save(parent, directory, stream, in_place=batch is not None)
            saved_s = time.monotonic() - started
            parent_layers = [str(directory / PARENT_DISK), *parent.layers]
            meta: dict[str, Any] = {
                "fork": fork_id,
                "parent": parent.id,
                "parent_generation": parent.generation,
                "image": self.image.name,
                "accel": self.accel,
                "shape": self.shape.__dict__,
                "parent_paused_seconds": paused,
                "parent_save_seconds": saved_s,
                "stream_bytes": stream.stat().st_size,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "depth": self.depth(parent) + 1,
                "disks": disks,
            }
            why_not = self._template_unavailable(mapped)
            if batch is not None:
                self._fill_template(batch.template, stream, directory / "memory.bin")
                template_memory.seal(batch.ram, self.virt.qemu_ids())
            elif why_not is None:
                ram = self._ram_path(fork_id)
                self._make_template(directory, parent_layers, ram, stream)
            if ram is not None:
                meta.update(
                    memory_mode="template",
                    ram_path=str(ram),
                    ram_resident_bytes=ram.stat().st_blocks * 512,
                    layers=[str(directory / "disk.qcow2"), *parent_layers],
                )
            else:  # children load the full stream, on an overlay of the frozen layer (``SavedState.disk``)
                shutil.move(str(stream), directory / "memory.bin")
                (directory / PARENT_DISK).rename(directory / "disk.qcow2")
                meta.update(
                    memory_mode="stream",
                    stream_reason=why_not,
                    layers=[str(directory / "disk.qcow2"), *parent.layers],
                )
                if mapped is not None:
                    meta["mapped_ram"] = str(mapped)
            stream.unlink(missing_ok=True)
            for layer in (directory / PARENT_DISK, directory / "disk.qcow2"):
                if layer.exists():
                    shared_layer(layer, self.virt.qemu_ids())
            meta["memory_bytes"] = (directory / "memory.bin").stat().st_size
            meta["save_seconds"] = time.monotonic() - started
            meta["ready_slots"] = len(batch.slots) if batch else 0
            tmp = directory / f".{META}.tmp"
            tmp.write_text(json.dumps(meta, indent=2) + "\n")
            tmp.rename(directory / META)  # a fork exists once its meta does
            return Saved(SavedState(directory, meta), list(batch.slots) if batch else [], stopped_at)
        except BaseException:
            stream.unlink(missing_ok=True)
            if batch is not None:
                self.release_slots(batch.slots)
                with contextlib.suppress(OsfleetError):
                    self._destroy(batch.template)
            self.unpin(fork_id)
            self._remove(directory, ram)
            raise

    def image_disks(self, parent: ReplicaRecord) -> list[dict[str, Any]]:
        """What identifies the image's disk under the parent, for its fork's meta (``image_changed`` checks it before
        any child starts): the golden disk is the one file of a chain replaced under the same name, the other layers
        are the fork's own. Recorded by the nearest state the parent's chain goes through (a fork's or the image's
        saved state: the bytes it was restored on, which a rebuild since does not change), else the image's disk as
        it is now (a cold-booted parent).

        A layer that is gone (the saved state the parent was restored from, removed because its image changed while
        the parent ran) is refused: the parent keeps running on the open file, but no child could open the chain,
        and the image's disk as it is now would be recorded for bytes the parent never ran on."""
        for layer in parent.layers:
            if not Path(layer).exists():
                raise StateImageChangedError(
                    f"replica {parent.id} cannot be forked: a layer of its disk is gone ({layer}), as when the saved"
                    " state it was restored from was removed because its image changed; reset it (it then runs on"
                    " the image as it is now) and fork again"
                )
        for layer in parent.layers:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                disks = json.loads((Path(layer).parent / META).read_text()).get("disks")
                if isinstance(disks, list) and disks:
                    return disks
        return [saved_state.disk_identity(self.image.disk)]

    def pin(self, fork_id: str) -> None:
        """Keep the fork from being collected while children start from it (``unpin`` after)."""
        with self._lock:
            self._pinned.add(fork_id)

    def unpin(self, fork_id: str) -> None:
        with self._lock:
            self._pinned.discard(fork_id)

    def _stream_path(self, fork_id: str, directory: Path) -> Path:
        """Where the parent's stream goes: tmpfs when there is one (it is read back at once and removed;
        on disk it would be written back for nothing), else the fork's directory."""
        memory_dir = self.settings.memory_dir
        if memory_dir is not None and template_memory.filesystem_type(memory_dir) in template_memory.MEMORY_FILESYSTEMS:
            memory_dir.mkdir(parents=True, exist_ok=True)
            return memory_dir / f"{fork_id}.stream"
        return directory / "parent.bin"

    def _live_save(self, parent: ReplicaRecord, directory: Path, stream: Path, in_place: bool) -> tuple[float, float]:
        """Stream the running parent out (pre-copy; QEMU stops it for the rest), copy its overlay and dump
        its screen while it stands still, let it go on. Returns (seconds it stood still, host time it
        stopped). Whatever happens, a parent is never left paused by a fork."""
        domain = parent.domain
        # A replica restored from template memory still has x-ignore-shared set from its own restore; it
        # changes the stream's format, and this stream carries all of the parent's (private) RAM.
        self.virt.qmp(domain, "migrate-set-capabilities", {"capabilities": NO_IGNORE_SHARED})
        self.virt.qmp(
            domain,
            "migrate-set-parameters",
            {"max-bandwidth": LIVE_BANDWIDTH_BYTES, "downtime-limit": DOWNTIME_LIMIT_MS},
        )
        saved_state.hand_over(self.virt, domain, stream, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        self.virt.qmp(domain, "migrate", {"uri": f"fd:{saved_state.FD_NAME}"})
        shot = None
        stopped = False
        try:
            status, asked_at = saved_state.wait_migration(self.virt, domain)
            stopped = True
            stopped_at = time.time() - (time.monotonic() - asked_at)
            # The stream's end flushed and inactivated the parent's disks: its overlay is consistent now.
            _copy_sparse(Path(parent.disk), directory / PARENT_DISK, in_place)
            shared_layer(directory / PARENT_DISK, self.virt.qemu_ids())  # the tenant's disk: QEMU's group only
            with contextlib.suppress(VirtError, OSError):  # the screen is for people (and the bench)
                shot = self.capture.grab(domain)
        finally:
            try:
                self.virt.resume(domain)  # QEMU takes its disks back ("cont" after an outgoing stream)
            except VirtError:
                if stopped:
                    raise
                # the stream failed before the end: QEMU kept the parent running
        resumed = time.monotonic()
        # QEMU's own count of the stop until the stream's end, plus ours from the last poll to the resume
        paused = float(status.get("downtime", 0)) / 1000 + (resumed - asked_at)
        if shot is not None:
            with contextlib.suppress(OSError):
                shot.save(directory / SCREEN)
        return paused, stopped_at - float(status.get("downtime", 0)) / 1000

    def _fill_template(self, template: str, stream: Path, device_state: Path) -> None:
        """Load the parent's stream into a waiting fork template (its RAM is the fork's RAM file, shared),
        then save its device state alone; it is destroyed after, the RAM file final."""
        try:
            saved_state.hand_over(self.virt, template, stream, os.O_RDONLY)
            self.virt.qmp(template, "migrate-incoming", {"uri": f"fd:{saved_state.FD_NAME}"})
            saved_state.wait_migration(self.virt, template)
            self.virt.qmp(template, "migrate-set-capabilities", {"capabilities": IGNORE_SHARED})
            saved_state.hand_over(self.virt, template, device_state, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            self.virt.qmp(template, "migrate", {"uri": f"fd:{saved_state.FD_NAME}"})
            saved_state.wait_migration(self.virt, template)
        finally:
            self._destroy(template)

    def _make_template(self, directory: Path, parent_layers: list[str], ram: Path, stream: Path) -> None:
        """A fork template started now (no slot was ready): new RAM file, overlay over the frozen layer."""
        name = f"{self.settings.template_prefix}{directory.name}"
        template_memory.create(ram, self.shape.memory_mib * 2**20, self.virt.qemu_ids())
        template_memory.claim(ram, directory)
        overlay = directory / "disk.qcow2"
        qcow2.create_overlay(overlay, directory / PARENT_DISK)
        spec = replica_spec(
            self.image,
            name,
            overlay,
            tuple(Path(p) for p in parent_layers),
            self.accel,
            self.shape,
            incoming=True,
            metadata={"role": "fork-template"},
            memory=MemoryFile(ram, share=True),
        )
        self.virt.start_transient(spec, paused=True)
        self._fill_template(name, stream, directory / "memory.bin")
        template_memory.seal(ram, self.virt.qemu_ids())

    def _ram_file(self, domain: str) -> Path | None:
        """The file the domain's guest RAM is mapped from, or None (anonymous RAM: a cold-booted replica)."""
        try:
            path = self.virt.qmp(domain, "qom-get", {"path": RAM_OBJECT, "property": "mem-path"})
        except VirtError:
            return None
        return Path(path) if isinstance(path, str) and path else None

    def _template_unavailable(self, mapped: Path | None) -> str | None:
        """Why this fork cannot use template memory, or None."""
        if mapped is None:
            return "the parent's RAM is not a file mapping (a cold-booted replica)"
        return template_memory.unavailable(self.settings.memory_dir, self.shape.memory_mib * 2**20)

    def _ram_path(self, fork_id: str) -> Path:
        assert self.settings.memory_dir is not None  # _template_unavailable checked it
        return self.settings.memory_dir / f"{self.image.name}-{fork_id}-{uuid.uuid4().hex[:8]}.ram"

    # --- ready slots -------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Start the next fork's template and ``ready`` child slots in the background (if wanted and not
        there yet)."""
        if self.ready < 1 or self._saved is None or self._closing.is_set():
            return
        with self._lock:
            if self._batch is not None or (self._preparing is not None and not self._preparing.done()):
                return
            self._preparing = self._prep.submit(self._prepare_quietly)

    def wait_ready(self) -> None:
        """Wait until slot preparation under way is done (benchmarks: as an agent's episode would)."""
        with self._lock:
            preparing = self._preparing
        if preparing is not None:
            preparing.result()

    def _prepare_quietly(self) -> None:
        try:
            self._prepare_batch()
        except Exception as exc:  # slots are an optimisation: forks still work without them
            log.warning("preparing fork slots: %s", as_osfleet(exc, "preparing fork slots"))

    def _prepare_batch(self) -> None:
        assert self._saved is not None
        state = self._saved()
        if state.memory_mode != "template" or template_memory.unavailable(
            self.settings.memory_dir, self.shape.memory_mib * 2**20
        ):
            return
        fork_id = f"f-{uuid.uuid4().hex[:10]}"
        directory = self.root / fork_id
        self.root.mkdir(parents=True, exist_ok=True)
        directory.mkdir()
        private_dir(directory, self.virt.qemu_ids())
        ram = self._ram_path(fork_id)
        base = [str(p) for p in state.layers(self.image)]
        batch = _Batch(fork_id, directory, ram, f"{self.settings.template_prefix}{fork_id}", base)
        try:
            template_memory.create(ram, self.shape.memory_mib * 2**20, self.virt.qemu_ids())
            template_memory.claim(ram, directory)
            # The frozen layer's file exists from now on (an empty overlay of the right chain); the fork
            # copies the parent's overlay into it.
            qcow2.create_overlay(directory / PARENT_DISK, state.layers(self.image)[0])
            # A backing layer QEMU opens itself (libvirt hands only the top disk to QEMU's user): readable by
            # QEMU's group from the start, not only once the fork is sealed.
            shared_layer(directory / PARENT_DISK, self.virt.qemu_ids())
            qcow2.create_overlay(directory / "disk.qcow2", directory / PARENT_DISK)
            parent_layers = (directory / PARENT_DISK, *state.layers(self.image))
            self.virt.start_transient(
                replica_spec(
                    self.image,
                    batch.template,
                    directory / "disk.qcow2",
                    parent_layers,
                    self.accel,
                    self.shape,
                    incoming=True,
                    metadata={"role": "fork-template"},
                    memory=MemoryFile(ram, share=True),
                ),
                paused=True,
            )
            child_layers = (directory / "disk.qcow2", *parent_layers)
            memory = MemoryFile(ram, share=False, rom_off=template_memory.maps_readonly_files())
            for _ in range(self.ready):
                if self._closing.is_set():
                    break
                rid = f"r-{uuid.uuid4().hex[:8]}"
                replica_dir = self.settings.replicas_dir / rid
                replica_dir.mkdir(parents=True)
                private_dir(replica_dir, self.virt.qemu_ids())
                disk = replica_dir / "disk-g1.qcow2"
                slot = Slot(rid, f"{self.settings.name_prefix}{rid}-g1", disk)
                batch.slots.append(slot)
                qcow2.create_overlay(disk, directory / "disk.qcow2")
                self.virt.start_transient(
                    replica_spec(
                        self.image,
                        slot.domain,
                        disk,
                        child_layers,
                        self.accel,
                        self.shape,
                        incoming=True,
                        metadata={"replica": rid, "generation": "1", "image": self.image.name, "role": "fork-slot"},
                        memory=memory,
                    ),
                    paused=True,
                )
        except BaseException:
            self._drop_batch(batch)
            raise
        with self._lock:
            if self._closing.is_set():
                drop = True
            else:
                self._batch, drop = batch, False
        if drop:
            self._drop_batch(batch)

    def _take_batch(self, parent: ReplicaRecord) -> _Batch | None:
        """The prepared batch, if there is one and the parent's chain is the one its slots were made on."""
        with self._lock:
            batch = self._batch
            if batch is None or parent.layers != batch.base_layers:
                return None
            self._batch = None
        if not self.virt.is_running(batch.template):
            self._drop_batch(batch)
            return None
        return batch

    def release_slots(self, slots: Iterable[Slot]) -> None:
        """Destroy slots no child took (they map a RAM file whose fork is done, or failed)."""
        for slot in slots:
            with contextlib.suppress(OsfleetError):
                self._destroy(slot.domain)
            shutil.rmtree(slot.disk.parent, ignore_errors=True)

    def _drop_batch(self, batch: _Batch) -> None:
        with contextlib.suppress(OsfleetError):
            self._destroy(batch.template)
        self.release_slots(batch.slots)
        remove_fork(batch.directory, self.settings.memory_dir, batch.ram)

    def _destroy(self, name: str) -> None:
        try:
            self.virt.destroy(name)
        finally:
            guest_control.PORTS.forget(name)

    def close(self) -> None:
        """Stop preparing and remove the prepared batch (its domains, files and RAM file)."""
        self._closing.set()
        self._prep.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            batch, self._batch = self._batch, None
        if batch is not None:
            self._drop_batch(batch)

    # --- reference counting ------------------------------------------------------------------------------------
    def load(self, fork_id: str) -> SavedState:
        directory = self.root / fork_id
        try:
            return SavedState(directory, json.loads((directory / META).read_text()))
        except (OSError, ValueError) as exc:
            raise OsfleetError(f"fork {fork_id} is not on this host ({exc})") from None

    def users(self, records: Iterable[ReplicaRecord]) -> dict[str, int]:
        """How many replicas use each saved fork (a disk chain through its directory)."""
        counts = {d.name: 0 for d in self._directories()}
        for rec in records:
            seen = {Path(p).parent.name for p in rec.layers if Path(p).parent.parent == self.root}
            for fork_id in seen & counts.keys():
                counts[fork_id] += 1
        return counts

    def mappers(self, records: Iterable[ReplicaRecord]) -> dict[str, int]:
        """How many replicas map each fork's RAM file: those whose nearest layer is the fork's own (a
        generation made from it); deeper in a chain only its disk is used."""
        counts: dict[str, int] = {}
        for rec in records:
            if rec.layers and Path(rec.layers[0]).parent.parent == self.root:
                name = Path(rec.layers[0]).parent.name
                counts[name] = counts.get(name, 0) + 1
        return counts

    def collect(self, records: Iterable[ReplicaRecord]) -> list[str]:
        """Remove every fork that no replica uses and no fork in progress holds, and the RAM file of every
        fork no replica maps any more; returns the ids of the forks removed."""
        now = time.time()
        records = list(records)
        counts = self.users(records)
        mapping = self.mappers(records)
        removed = []
        with self._lock:
            pinned = set(self._pinned)
            if self._batch is not None:
                pinned.add(self._batch.fork_id)
        pinned |= self._kept()
        for fork_id, n in counts.items():
            directory = self.root / fork_id
            if fork_id in pinned:
                continue
            if not (directory / META).exists():
                try:
                    if now - directory.stat().st_mtime < UNFINISHED_AGE_SECONDS:
                        continue  # another process may be saving it right now
                except OSError:
                    continue
            if not n:
                self._remove(directory, None)
                removed.append(fork_id)
            elif not mapping.get(fork_id):
                _release_ram(directory)
        return removed

    def info(self, records: Iterable[ReplicaRecord]) -> list[ForkInfo]:
        out = []
        for fork_id, n in sorted(self.users(records).items()):
            directory = self.root / fork_id
            try:
                meta = json.loads((directory / META).read_text())
            except (OSError, ValueError):
                continue  # being saved, or a prepared batch
            ram = Path(meta["ram_path"]) if meta.get("ram_path") else None
            ram_bytes = ram.stat().st_blocks * 512 if ram is not None and ram.exists() else 0
            disk = sum(qcow2.allocated_bytes(p) for p in directory.glob("*.qcow2"))
            stream = directory / "memory.bin"
            out.append(
                ForkInfo(
                    id=fork_id,
                    parent=str(meta.get("parent", "")),
                    memory_mode=str(meta.get("memory_mode", "")),
                    children=n,
                    disk_bytes=disk,
                    memory_bytes=ram_bytes + (stream.stat().st_size if stream.exists() else 0),
                )
            )
        return out

    def _directories(self) -> list[Path]:
        if not self.root.exists():
            return []
        return [d for d in self.root.iterdir() if d.is_dir() and d.name.startswith("f-")]

    def _remove(self, directory: Path, ram: Path | None) -> None:
        remove_fork(directory, self.settings.memory_dir, ram)


def image_changed(state: SavedState, what: str, remedy: str) -> StateImageChangedError | None:
    """The refusal to start anything from a fork's state (a checkpoint's too) whose image disk changed since it was
    saved, or that records none (saved by an older osfleet), as ``saved_state.stale_reason`` judges it; None when it
    may be restored. Restoring it would put the guest's page cache over other bytes (``Bad message``)."""
    why = state.stale()
    if why is None:
        return None
    return StateImageChangedError(
        f"{what} was saved on image {state.meta.get('image', '?')} and cannot be restored: {why}; {remedy}"
    )


def _release_ram(directory: Path) -> None:
    """Drop a fork's RAM file (and device state) once nothing maps it; its disk layers stay for the chains
    that go through them. The fork can no longer start children (none are asked of an ancestor)."""
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, ValueError):
        return
    if not meta.get("ram_path"):
        return
    ram = Path(meta["ram_path"])
    ram.unlink(missing_ok=True)
    template_memory.owner_file(ram).unlink(missing_ok=True)
    (directory / "memory.bin").unlink(missing_ok=True)
    meta.pop("ram_path")
    meta["ram_released"] = True
    tmp = directory / f".{META}.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    tmp.rename(directory / META)


def remove_fork(directory: Path, memory_dir: Path | None, ram: Path | None = None) -> None:
    """Delete a fork's directory and its RAM file (named in its meta, or given while it is being saved)."""
    try:
        meta = json.loads((directory / META).read_text())
        if meta.get("ram_path"):
            ram = Path(meta["ram_path"])
    except (OSError, ValueError):
        pass
    if ram is None and memory_dir is not None:  # unfinished: find its RAM file by its owner file
        for owner in memory_dir.glob("*.state"):
            with contextlib.suppress(OSError):
                if Path(owner.read_text().strip()) == directory:
                    ram = owner.with_suffix(".ram")
    if ram is not None:
        ram.unlink(missing_ok=True)
        template_memory.owner_file(ram).unlink(missing_ok=True)
    if memory_dir is not None:
        (memory_dir / f"{directory.name}.stream").unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def remove_all_forks(settings: Settings, keep: set[str] | frozenset[str] = frozenset()) -> int:
    """Every fork of this host but those in ``keep`` (checkpoints'; once its replicas are gone no other fork
    can be used); returns how many."""
    if not settings.forks_dir.exists():
        return 0
    n = 0
    for directory in settings.forks_dir.iterdir():
        if directory.is_dir() and directory.name not in keep:
            remove_fork(directory, settings.memory_dir)
            n += 1
    return n


def _copy_sparse(src: Path, dst: Path, in_place: bool) -> None:
    """Copy an overlay (sparse: only its data extents) in-process, ~ms for a few MiB; ``in_place`` writes
    into ``dst``'s existing file (its inode is open in waiting domains: see the module docstring)."""
    flags = os.O_WRONLY | (os.O_TRUNC if in_place else os.O_CREAT | os.O_EXCL)
    try:
        fin = os.open(src, os.O_RDONLY)
        try:
            fout = os.open(dst, flags, 0o600)  # a tenant's disk (``shared_layer`` opens it to QEMU's group)
            try:
                size = os.fstat(fin).st_size
                os.ftruncate(fout, size)
                offset = 0
                while offset < size:
                    try:
                        start = os.lseek(fin, offset, os.SEEK_DATA)
                    except OSError:  # ENXIO: no data after offset
                        break
                    end = os.lseek(fin, start, os.SEEK_HOLE)
                    pos = start
                    while pos < end:
                        n = os.copy_file_range(fin, fout, min(COPY_CHUNK, end - pos), pos, pos)
                        if n <= 0:
                            raise OSError(f"short copy at {pos}")
                        pos += n
                    offset = end
            finally:
                os.close(fout)
        finally:
            os.close(fin)
    except OSError as exc:
        raise as_osfleet(exc, f"copying {src} into a fork") from exc
