"""Making and unmaking a replica's generations: each generation is one transient domain on its own overlay.

A reset makes the next generation and hands the previous one to a background clean-up, so destroying the
old guest (1-2 s) is off the critical path. For snapshot replicas the next generation's QEMU is started
paused ahead of time (a standby), so a reset only loads memory into it.
"""

from __future__ import annotations

import logging
import secrets
import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from osfleet import qcow2, screen
from osfleet.config import Mode, ReplicaShape, Settings
from osfleet.domain_xml import Accel
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.images import GoldenImage
from osfleet.readiness import wait_until_ready
from osfleet.replicas import saved_state
from osfleet.replicas.records import ReplicaRecord, State
from osfleet.replicas.spec import replica_spec
from osfleet.virt import Virt

log = logging.getLogger(__name__)

COLD_BOOT_TIMEOUT_SECONDS = 300.0
AGENT_TIMEOUT_SECONDS = 60.0
CLEANUP_WORKERS = 4


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
    ) -> None:
        self.virt = virt
        self.image = image
        self.accel = accel
        self.shape = shape
        self.settings = settings
        self.say = say
        self._saved: saved_state.SavedState | None = None
        self._saved_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cleanup = ThreadPoolExecutor(max_workers=CLEANUP_WORKERS, thread_name_prefix="osfleet-cleanup")
        self._pending: list[Future[None]] = []
        self._standby: dict[str, Future[str | None]] = {}
        self._standby_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osfleet-standby")
        self._closing = threading.Event()

    def domain_name(self, replica_id: str, generation: int) -> str:
        return f"{self.settings.name_prefix}{replica_id}-g{generation}"

    def replica_dir(self, replica_id: str) -> Path:
        return self.settings.replicas_dir / replica_id

    # --- saved state ---------------------------------------------------------------------------------------
    def saved(self) -> saved_state.SavedState:
        with self._saved_lock:
            if self._saved is None:
                self._saved = saved_state.ensure_saved_state(
                    self.virt, self.image, self.accel, self.shape, self.settings, self.say
                )
            return self._saved

    # --- one generation ------------------------------------------------------------------------------------
    def bring_up(self, rec: ReplicaRecord, mode: Mode) -> None:
        """Make generation ``rec.generation + 1`` of the replica and wait until it is ready.

        The caller holds the replica's lock and saves the record; the record names the new domain and
        disk before either exists, so a crash in between leaves something adoption can find and clean.
        """
        rec.generation += 1
        rec.domain = self.domain_name(rec.id, rec.generation)
        disk = self.replica_dir(rec.id) / f"disk-g{rec.generation}.qcow2"
        rec.disk = str(disk)
        meta = {"replica": rec.id, "generation": str(rec.generation), "image": self.image.name}
        if rec.state == State.PROVISIONING:
            rec.move(State.BOOTING)
        if mode == "snapshot":
            state = self.saved()
            rec.layers = [str(state.disk), str(self.image.disk)]
            if not self._take_standby(rec.id, rec.domain):
                saved_state.start_incoming(self.virt, state, self.image, rec.domain, disk, self.shape, meta)
            saved_state.load_memory(self.virt, state, rec.domain)
            self.set_identity(rec)
            shot = self.virt.screenshot(rec.domain)
            if not screen.desktop_drawn(shot, self.image.background, self.image.screen):
                raise OsfleetError(f"{rec.domain}: restored desktop is not drawn")
        else:
            rec.layers = [str(self.image.disk)]
            disk.unlink(missing_ok=True)
            qcow2.create_overlay(disk, self.image.disk)
            spec = replica_spec(self.image, rec.domain, disk, (self.image.disk,), self.accel, self.shape, metadata=meta)
            start = time.monotonic()
            self.virt.start_transient(spec)
            wait_until_ready(self.virt, self.image, rec.domain, start, COLD_BOOT_TIMEOUT_SECONDS)
            self.set_identity(rec)

    def set_identity(self, rec: ReplicaRecord) -> None:
        """Give the guest its own hostname and machine id, fresh randomness and the right time.

        Restored clones would otherwise share all of them with the saved template; one guest-exec does it
        all (guest-set-time would also write the RTC, which waits for a second boundary).
        """
        self.virt.wait_for_agent(rec.domain, AGENT_TIMEOUT_SECONDS)
        seed = secrets.token_hex(64)
        host, machine = shlex.quote(rec.hostname), shlex.quote(rec.machine_id)
        # Shell builtins only, and one exec (date): every process start is slow in a just-resumed TCG guest.
        script = (
            f"printf %s {host} > /proc/sys/kernel/hostname && echo {host} > /etc/hostname && "
            f"echo {machine} > /etc/machine-id && printf %s {seed} > /dev/urandom && "
            f"exec date -u -s @{time.time():.3f} >/dev/null"
        )
        code, _, err = self.virt.guest_exec(rec.domain, ["/bin/sh", "-c", script], timeout=30)
        if code != 0:
            raise OsfleetError(f"{rec.domain}: setting identity failed: {err.strip()[:200]}")

    # --- standby: the next generation's QEMU, started paused ahead of time ---------------------------------
    def prepare_standby(self, rec: ReplicaRecord) -> None:
        """Start generation ``rec.generation + 1`` paused in the background, so a snapshot reset skips the
        ~0.6 s of starting QEMU. It waits for a migration stream and costs only QEMU's own memory."""
        if rec.mode != "snapshot" or self._closing.is_set():
            return
        rid, gen = rec.id, rec.generation + 1
        name = self.domain_name(rid, gen)
        disk = self.replica_dir(rid) / f"disk-g{gen}.qcow2"
        meta = {"replica": rid, "generation": str(gen), "image": self.image.name, "role": "standby"}

        def work() -> str | None:
            try:
                saved_state.start_incoming(self.virt, self.saved(), self.image, name, disk, self.shape, meta)
                return name
            except Exception as exc:  # a standby is an optimisation: the reset starts QEMU itself instead
                self.say(f"standby for {rid}: {as_osfleet(exc, 'starting a standby')}")
                return None

        with self._lock:
            self._standby[rid] = self._standby_pool.submit(work)

    def _take_standby(self, rid: str, name: str) -> bool:
        """Use the prepared standby if it is the generation being made; else discard it."""
        with self._lock:
            future = self._standby.pop(rid, None)
        if future is None:
            return False
        ready = future.result()
        if ready == name and self.virt.is_running(name):
            return True
        if ready is not None:
            self.virt.destroy(ready)
        return False

    def drop_standby(self, rid: str) -> None:
        with self._lock:
            future = self._standby.pop(rid, None)
        if future is not None and (name := future.result()):
            self.virt.destroy(name)

    # --- taking generations down ---------------------------------------------------------------------------
    def retire_generation(self, domain: str, disk: Path) -> None:
        """Destroy an old generation's domain and disk in the background (off the reset's critical path)."""

        def work() -> None:
            try:
                self.virt.destroy(domain)
                disk.unlink(missing_ok=True)
            except Exception as exc:  # adoption or `replicas down` finds what is left by its name
                log.warning("cleaning up %s: %s", domain, as_osfleet(exc, f"destroying {domain}"))

        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._cleanup.submit(work))

    def destroy_all(self, replica_id: str) -> None:
        """Every domain of the replica, whatever its generation (standby included)."""
        for name in self.virt.names(f"{self.settings.name_prefix}{replica_id}-"):
            self.virt.destroy(name)

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
        with self._lock:
            pending = list(self._pending)
        for f in pending:
            f.result()
        self._cleanup.shutdown(wait=True)
