"""Making and unmaking a replica's generations: each generation is one transient domain on its own overlay.

A reset makes the next generation and hands the previous one to a background clean-up, so pausing and
destroying the old guest (1-2 s) is off the critical path. For snapshot replicas the next generation is
made ahead of time, in the background, as a *spare*: restored from the saved state, given the replica's
identity (hostname, machine id, reseeded randomness, clock: one line to the guest's resident helper,
``osfleet.replicas.guest_control``), its screen checked, and paused. A reset then only resumes the spare
and sets the guest clock (it stood still while the spare was paused): everything that can be checked
before is checked when the spare is made, so what is left on the reset's path is one libvirt call and
one line on the control port. A spare that is still being made is waited for (it is doing what the
reset would do); one that failed, or was only started (``spares=False``: QEMU waiting for the stream,
the older "standby"), is finished on the normal path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import GuestTimeoutError, OsfleetError, as_osfleet
from osfleet.measure.timing import stage
from osfleet.protocol.models import Mode
from osfleet.replicas import guest_clock, guest_control, saved_state
from osfleet.replicas.forks import Slot
from osfleet.replicas.records import ReplicaRecord, State
from osfleet.replicas.spec import replica_spec
from osfleet.replicas.template_memory import MemoryMode
from osfleet.vm import qcow2, screen
from osfleet.vm.domain_xml import Accel
from osfleet.vm.images import GoldenImage
from osfleet.vm.readiness import wait_until_ready
from osfleet.vm.virt import Virt, VirtError

log = logging.getLogger(__name__)

COLD_BOOT_TIMEOUT_SECONDS = 300.0
# A desktop that is not drawn this long after the guest agent answered will not be (a session stopped at
# a bare background, seen with the office image): the generation is made again (``Lifecycle``).
DESKTOP_AFTER_AGENT_SECONDS = 120.0
SAVE_ATTEMPTS = 2
# A just-restored guest on a host short of CPU can take seconds to run its helper for the first time.
IDENTITY_TIMEOUT_SECONDS = 60.0
CLEANUP_WORKERS = 4


@dataclass(frozen=True)
class Spare:
    """The next generation of a replica, made ahead of time. ``restored``: memory loaded, identity set,
    paused (a reset only resumes it); else its QEMU waits for the stream (a reset loads it)."""

    name: str
    restored: bool
    control: Path | None = None  # the host end of its control port (known once it is restored)


class Generations:
    """Builds generations of replicas of one image on one host; thread-safe."""

    def __init__(
        self,
        virt: Virt,
        image: GoldenImage,
        accel: Accel,
        shape: ReplicaShape,
        settings: Settings,
        say: Callable[[str], None],
        memory: MemoryMode | None = None,
        spares: bool = True,
    ) -> None:
        """``memory``: the saved state's memory mode; None picks ``template`` where this host can, else
        ``stream``. ``spares``: make the next generation ahead of time (restored with template memory,
        where a spare costs ~50 MiB; only its QEMU started with full streams, where a restored one would
        cost a whole guest's RAM). False: no spare, every reset starts QEMU (densest)."""
        self.virt = virt
        self.image = image
        self.accel = accel
        self.shape = shape
        self.settings = settings
        self.say = say
        self.memory = memory
        self.spares = spares
        self._saved: saved_state.SavedState | None = None
        self._saved_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cleanup = ThreadPoolExecutor(max_workers=CLEANUP_WORKERS, thread_name_prefix="osfleet-cleanup")
        self._pending: list[Future[None]] = []
        self._standby: dict[str, Future[Spare | None]] = {}
        self._standby_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osfleet-standby")
        self._control_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="osfleet-control")
        self._closing = threading.Event()
        self._screens_ok: bool | None = None

    def domain_name(self, replica_id: str, generation: int) -> str:
        return f"{self.settings.name_prefix}{replica_id}-g{generation}"

    def replica_dir(self, replica_id: str) -> Path:
        return self.settings.replicas_dir / replica_id

    # --- saved state ---------------------------------------------------------------------------------------
    def saved(self) -> saved_state.SavedState:
        with self._saved_lock:
            # One stat: an image replaced under this running agent would break every replica restored from it.
            if self._saved is not None and (why := self._saved.stale()) is not None:
                self.say(f"saved state {self._saved.directory.name} is stale: {why}; making it again")
                self._saved = None
            if self._saved is None:
                memory = self.memory
                if memory is None:
                    memory, reason = saved_state.choose_memory_mode(self.settings, self.shape)
                    if reason:
                        self.say(f"restoring full memory streams: {reason}")
                for attempt in range(1, SAVE_ATTEMPTS + 1):  # a template boot can stall like any boot
                    try:
                        self._saved = saved_state.ensure_saved_state(
                            self.virt, self.image, self.accel, self.shape, self.settings, self.say, memory
                        )
                        break
                    except GuestTimeoutError as exc:
                        if attempt == SAVE_ATTEMPTS:
                            raise
                        self.say(f"saving the running state: {exc}; booting the template again")
            assert self._saved is not None  # made above, or the last attempt raised
            return self._saved

    # --- one generation ------------------------------------------------------------------------------------
    def bring_up(self, rec: ReplicaRecord, mode: Mode) -> None:
        """Make generation ``rec.generation + 1`` of the replica and wait until it is ready.

        The caller holds the replica's lock and saves the record; the record names the new domain and
        disk before either exists, so a crash in between leaves something adoption can find and clean.
        """
        rec.generation += 1
        rec.domain = self.domain_name(rec.id, rec.generation)
        rec.parked = False  # a new generation runs
        disk = self.replica_dir(rec.id) / f"disk-g{rec.generation}.qcow2"
        rec.disk = str(disk)
        meta = {"replica": rec.id, "generation": str(rec.generation), "image": self.image.name}
        if rec.state == State.PROVISIONING:
            rec.move(State.BOOTING)
        if mode == "snapshot":
            state = self.saved()
            rec.layers = [str(p) for p in state.layers(self.image)]
            with stage("reset.spare_wait"):
                spare = self._take_standby(rec.id, rec.domain)
            if spare is not None and spare.restored:
                # Identity set and screen checked when the spare was made; only its clock stood still.
                with stage("reset.resume"):
                    self.virt.resume(rec.domain)
                with stage("reset.clock"):
                    guest_clock.set_now(self.virt, rec.domain, spare.control)
                return
            if spare is None:
                saved_state.start_incoming(self.virt, state, self.image, rec.domain, disk, self.shape, meta)
            saved_state.load_memory(self.virt, state, rec.domain)
            self.set_identity(rec)
            if not self.desktop_drawn(rec.domain):
                raise OsfleetError(f"{rec.domain}: restored desktop is not drawn")
        else:
            rec.layers = [str(self.image.disk)]
            disk.unlink(missing_ok=True)
            qcow2.create_overlay(disk, self.image.disk)
            spec = replica_spec(self.image, rec.domain, disk, (self.image.disk,), self.accel, self.shape, metadata=meta)
            start = time.monotonic()
            self.virt.start_transient(spec)
            wait_until_ready(
                self.virt,
                self.image,
                rec.domain,
                start,
                COLD_BOOT_TIMEOUT_SECONDS,
                after_agent=DESKTOP_AFTER_AGENT_SECONDS,
            )
            guest_control.start(self.virt, rec.domain)  # a snapshot's guests have it from their saved state
            self.set_identity(rec)

    def bring_up_from(
        self,
        rec: ReplicaRecord,
        state: saved_state.SavedState,
        slot: Slot | None = None,
        stopped_at: float | None = None,
        vcpu_nice: int | None = None,
    ) -> None:
        """Make generation ``rec.generation + 1`` from ``state`` instead of the replica's initial state: a
        fork's child starts where its parent was. The caller holds the lock and saves the record, as for
        ``bring_up``; the child's next reset goes back to the image's initial state like any replica's.

        ``slot``: the child's domain, started ahead of time on this fork's files (``forks``): only the
        device state is loaded. ``stopped_at``: host time the parent stopped; the child's clock is moved
        on by the time since, in the background (``adjust_clock_later``). ``vcpu_nice``: the child's vCPUs start
        at that priority (its siblings still loading go first; ``Lifecycle.fork`` sets it back)."""
        rec.generation += 1
        rec.domain = self.domain_name(rec.id, rec.generation)
        rec.parked = False
        disk = self.replica_dir(rec.id) / f"disk-g{rec.generation}.qcow2"
        rec.disk = str(disk)
        rec.layers = [str(p) for p in state.layers(self.image)]
        if rec.state == State.PROVISIONING:
            rec.move(State.BOOTING)
        meta = {"replica": rec.id, "generation": str(rec.generation), "image": self.image.name}
        if slot is None or slot.domain != rec.domain or not self.virt.is_running(slot.domain):
            with stage("fork.start"):
                saved_state.start_incoming(self.virt, state, self.image, rec.domain, disk, self.shape, meta)
        with stage("fork.load"):
            saved_state.load_memory(self.virt, state, rec.domain, vcpu_nice)
        resumed = time.time()
        # The parent's screen may show anything (an app over the desktop), so it is not judged: the stream
        # loaded and the guest runs. Identity: an exact copy (forks); the kernel reseeded its RNG on the new
        # VM generation ID as it resumed.
        if stopped_at is not None:
            self.adjust_clock_later(rec.domain, max(0.0, resumed - stopped_at))

    def adjust_clock_later(self, domain: str, seconds: float) -> None:
        """Move the guest's clock on by ``seconds`` (the time it stood still) through its helper, without
        waiting: the adjustment is relative, so it is right whenever the helper runs (in a just-restored
        guest, whose translated code is cold, ~0.2 s later)."""

        def work() -> None:
            try:
                guest_control.adjust_time(
                    guest_control.socket_path(self.virt, domain), seconds, IDENTITY_TIMEOUT_SECONDS
                )
            except OsfleetError as exc:
                log.warning("%s: the clock was not moved on by %.2f s: %s", domain, seconds, exc)

        self._control_pool.submit(work)

    def vcpus_at_normal_priority(self, domain: str) -> None:
        """Set the domain's vCPUs back to the priority of every other replica, after a fork's child loaded at a
        low one (``vcpu_nice`` of ``bring_up_from``): by ``Lifecycle.fork`` once every sibling runs, or by
        adoption when the host agent that forked died in between."""
        try:
            self.virt.set_vcpu_nice(domain, 0)
        except OsfleetError as exc:  # gone meanwhile or not answering QMP: the monitor sees to it
            log.warning("%s: its vCPUs could not be set back to normal priority: %s", domain, exc)

    def desktop_drawn(self, domain: str) -> bool:
        """The replica's screen shows the desktop. On the reset path: QMP ``screendump`` straight into a
        file on tmpfs (about half of libvirt's screenshot stream), judged on every 4th pixel."""
        shots = self.settings.memory_dir / "screens" if self.settings.memory_dir else None
        if shots is None or not self._screens_dir(shots):
            shot = self.virt.screenshot(domain)
        else:
            path = shots / f"{domain}.ppm"
            try:
                self.virt.qmp(domain, "screendump", {"filename": str(path)})
                with Image.open(path) as img:
                    shot = img.convert("RGB")
            except (VirtError, OSError) as exc:  # e.g. QEMU cannot write there: libvirt's stream still works
                if not self.virt.is_running(domain):
                    raise
                log.info("screendump of %s into %s failed (%s); using libvirt's screenshot", domain, shots, exc)
                self._screens_ok = False
                shot = self.virt.screenshot(domain)
            finally:
                path.unlink(missing_ok=True)
        if shot.size != self.image.screen:
            return False
        small = shot.resize((shot.width // 4, shot.height // 4), Image.Resampling.NEAREST)  # exact colours kept
        return screen.desktop_drawn(small, self.image.background, small.size)

    def _screens_dir(self, path: Path) -> bool:
        """A directory QEMU's user can write screendumps into (made once)."""
        if self._screens_ok is None:
            try:
                path.mkdir(parents=True, exist_ok=True)
                owner = self.virt.qemu_ids()
                if owner is not None:
                    os.chown(path, *owner)
                path.chmod(0o700)
                self._screens_ok = True
            except OSError as exc:
                log.info("screendumps through libvirt: %s", exc)
                self._screens_ok = False
        return self._screens_ok

    def set_identity(self, rec: ReplicaRecord) -> Path:
        """Give the guest its own hostname and machine id, reseeded randomness and the right time; returns
        the domain's control socket.

        Restored clones would otherwise share all of them with the saved template (the VM generation ID
        reseeds the kernel's RNG by itself; the helper's reseed also covers kernels without its driver).
        One line to the resident helper does it all, a few ms where a guest-exec took ~1 s.
        """
        path = guest_control.socket_path(self.virt, rec.domain)
        guest_control.set_identity(path, rec.hostname, rec.machine_id, IDENTITY_TIMEOUT_SECONDS)
        return path

    # --- spares: the next generation, made ahead of time ---------------------------------------------------
    def prepare_standby(self, rec: ReplicaRecord) -> None:
        """Make generation ``rec.generation + 1`` in the background: restored, with the replica's identity,
        its screen checked, paused (a spare), so a snapshot reset only resumes it and sets its clock. With
        full-stream states only its QEMU is started (a reset then loads memory and sets the identity)."""
        if rec.mode != "snapshot" or not self.spares or self._closing.is_set():
            return
        rid, gen = rec.id, rec.generation + 1
        name = self.domain_name(rid, gen)
        disk = self.replica_dir(rid) / f"disk-g{gen}.qcow2"
        meta = {"replica": rid, "generation": str(gen), "image": self.image.name, "role": "standby"}
        identity = rec.model_copy(update={"domain": name})  # a copy: the caller keeps its record

        def work() -> Spare | None:
            try:
                state = self.saved()
                saved_state.start_incoming(self.virt, state, self.image, name, disk, self.shape, meta)
                if state.memory_mode != "template":
                    return Spare(name, restored=False)
                saved_state.load_memory(self.virt, state, name)
                control = self.set_identity(identity)
                if not self.desktop_drawn(name):  # checked now, so the reset need not
                    raise OsfleetError(f"{name}: restored desktop is not drawn")
                self.virt.suspend(name)
                return Spare(name, restored=True, control=control)
            except Exception as exc:  # a spare is an optimisation: the reset makes the generation itself
                self.say(f"spare for {rid}: {as_osfleet(exc, 'making a spare')}")
                try:
                    self.destroy(name)
                except OsfleetError as err:
                    log.warning("removing the failed spare %s: %s", name, err)
                return None

        with self._lock:
            self._standby[rid] = self._standby_pool.submit(work)

    def _take_standby(self, rid: str, name: str) -> Spare | None:
        """The prepared spare if it is the generation being made and still there; else discard it."""
        with self._lock:
            future = self._standby.pop(rid, None)
        if future is None:
            return None
        spare = future.result()
        if spare is not None and spare.name == name and self.virt.is_running(name):
            return spare
        if spare is not None:
            self.destroy(spare.name)
        return None

    def spare_ready(self, rid: str) -> bool:
        """A restored spare is waiting for this replica's next reset."""
        with self._lock:
            future = self._standby.get(rid)
        if future is None or not future.done():
            return False
        spare = future.result()
        return spare is not None and spare.restored

    def drop_standby(self, rid: str) -> None:
        with self._lock:
            future = self._standby.pop(rid, None)
        if future is not None and (spare := future.result()):
            self.destroy(spare.name)

    # --- taking generations down ---------------------------------------------------------------------------
    def retire_generation(self, domain: str, disk: Path) -> None:
        """Pause, then destroy an old generation's domain and disk in the background (off the reset's
        critical path)."""

        def work() -> None:
            try:
                with contextlib.suppress(OsfleetError):  # stop it competing for CPU while QEMU is torn down
                    self.virt.suspend(domain)
                self.destroy(domain)
                disk.unlink(missing_ok=True)
            except Exception as exc:  # adoption or `replicas down` finds what is left by its name
                log.warning("cleaning up %s: %s", domain, as_osfleet(exc, f"destroying {domain}"))

        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._cleanup.submit(work))

    def destroy(self, name: str) -> bool:
        """Destroy one domain and close the host's connection to its control port."""
        try:
            return self.virt.destroy(name)
        finally:
            guest_control.PORTS.forget(name)

    def destroy_all(self, replica_id: str) -> None:
        """Every domain of the replica, whatever its generation (standby included)."""
        for name in self.virt.names(f"{self.settings.name_prefix}{replica_id}-"):
            self.destroy(name)

    def settle(self) -> None:
        """Wait until background work (old generations' teardown, standbys) is done, as it would be after
        an agent's episode; benchmarks call this between resets."""
        with self._lock:
            pending, standbys = list(self._pending), list(self._standby.values())
        for f in pending:
            f.result()
        for s in standbys:
            s.result()

    def close(self) -> None:
        self._closing.set()
        for rid in list(self._standby):
            self.drop_standby(rid)
        self._standby_pool.shutdown(wait=True)
        self._control_pool.shutdown(wait=True)
        with self._lock:
            pending = list(self._pending)
        for f in pending:
            f.result()
        self._cleanup.shutdown(wait=True)
