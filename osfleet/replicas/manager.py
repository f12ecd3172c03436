"""The replicas of one host: bring-up, resets, failure detection and recovery, adoption, warm pool.

Each replica has its own record (records.py), its own directory of disk layers and, per generation, its
own transient libvirt domain named ``osfleet-<id>-g<generation>``. A reset builds the next generation
and hands the previous domain to a background clean-up, so destroying the old guest (1-2 s) is off the
critical path. Nothing here touches a domain or file that does not carry the project's prefix.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import libvirt

from osfleet import qcow2, screen
from osfleet.accel import detect_accelerator
from osfleet.config import NAME_PREFIX, ReplicaShape, Settings
from osfleet.errors import OsfleetError
from osfleet.images import GoldenImage
from osfleet.readiness import wait_until_ready
from osfleet.replicas import saved_state
from osfleet.replicas.actions import Action, ActionResult, run_actions
from osfleet.replicas.records import (
    RUNNING_STATES,
    TRANSIENT_STATES,
    Lease,
    RecordStore,
    ReplicaRecord,
    State,
    owned_by_other_live_process,
)
from osfleet.replicas.spec import replica_spec
from osfleet.virt import Virt

Mode = Literal["cold", "snapshot"]
MODES: tuple[Mode, ...] = ("cold", "snapshot")
REPLICA_PREFIX = f"{NAME_PREFIX}r-"
COLD_BOOT_TIMEOUT_SECONDS = 300.0
MONITOR_INTERVAL_SECONDS = 1.0
DEFAULT_LEASE_SECONDS = 600.0
AGENT_TIMEOUT_SECONDS = 60.0
EXPIRED_LEASES_REMEMBERED = 10000


class ReplicaNotFoundError(OsfleetError):
    """No replica with that id on this host."""


class ReplicaBusyError(OsfleetError):
    """The replica is in a state that does not allow the operation (e.g. resetting, failed)."""


class NoReplicaAvailableError(OsfleetError):
    """No ready replica to lease right now."""


class LeaseError(OsfleetError):
    """The lease is unknown, expired or held by someone else."""


@dataclass
class AdoptReport:
    kept: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    orphan_domains: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # managed by another live process: left alone


@dataclass(frozen=True)
class Timed:
    """How long a bring-up or reset took until the replica was ready, and in which mode."""

    replica: str
    mode: Mode
    seconds: float


def domain_name(replica_id: str, generation: int) -> str:
    return f"{NAME_PREFIX}{replica_id}-g{generation}"


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
    ) -> None:
        if mode not in MODES:
            raise OsfleetError(f"unknown reset mode {mode!r} (cold or snapshot)")
        self.image = image
        self.settings = settings or Settings.from_env()
        self.shape = shape or ReplicaShape()
        self.mode: Mode = mode
        self.warm = warm
        self.auto_recover = auto_recover
        self.say = say or (lambda _m: None)
        self.virt = Virt(self.settings.libvirt_uri)
        self.accel = detect_accelerator(image.kernel, self.settings)
        self.store = RecordStore(self.settings.replicas_dir)
        self.records: dict[str, ReplicaRecord] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._registry = threading.Lock()
        self._saved: saved_state.SavedState | None = None
        self._saved_lock = threading.Lock()
        self._cleanup = ThreadPoolExecutor(max_workers=4, thread_name_prefix="osfleet-cleanup")
        self._pending: list[Future[None]] = []
        self._standby: dict[str, Future[str | None]] = {}
        self._standby_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osfleet-standby")
        self._provisioner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osfleet-provision")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.counters = {"failures_detected": 0, "recoveries": 0, "resets": 0}
        # Leases ended by expiry, so a late caller hears "expired" rather than "unknown lease".
        self._expired: OrderedDict[str, str] = OrderedDict()

    # --- lifecycle of the host object ------------------------------------------------------------------
    def close(self) -> None:
        self.stop_background()
        self._provisioner.shutdown(wait=True, cancel_futures=True)
        for rid in list(self._standby):
            self._drop_standby(rid)
        self._standby_pool.shutdown(wait=True)
        self.drain_cleanup()
        self._cleanup.shutdown(wait=True)
        self.virt.close()

    def __enter__(self) -> ReplicaHost:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start_background(self) -> None:
        """Watch replicas for failures and expired leases, and keep the warm pool filled."""
        for target, name in ((self._monitor_loop, "osfleet-monitor"), (self._pool_loop, "osfleet-pool")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop_background(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=COLD_BOOT_TIMEOUT_SECONDS)
        self._threads.clear()

    def drain_cleanup(self) -> None:
        for f in list(self._pending):
            f.result()
        self._pending.clear()

    def settle(self) -> None:
        """Wait until background work (old generations' teardown, standbys) is done, as it would be after
        an agent's episode; benchmarks call this between resets."""
        self.drain_cleanup()
        with self._registry:
            futures = list(self._standby.values())
        for f in futures:
            f.result()

    # --- records --------------------------------------------------------------------------------------
    def _save(self, record: ReplicaRecord) -> None:
        record.owner_pid = os.getpid()
        self.store.save(record)

    @contextmanager
    def _locked(self, replica_id: str) -> Iterator[ReplicaRecord]:
        with self._registry:
            lock = self._locks.get(replica_id)
            record = self.records.get(replica_id)
        if lock is None or record is None:
            raise ReplicaNotFoundError(f"no replica {replica_id}")
        with lock:
            if replica_id not in self.records:
                raise ReplicaNotFoundError(f"no replica {replica_id}")
            yield record

    def get(self, replica_id: str) -> ReplicaRecord:
        with self._registry:
            record = self.records.get(replica_id)
        if record is None:
            raise ReplicaNotFoundError(f"no replica {replica_id}")
        return record.model_copy(deep=True)

    def replicas(self) -> list[ReplicaRecord]:
        with self._registry:
            return [r.model_copy(deep=True) for r in sorted(self.records.values(), key=lambda r: r.created_at)]

    def replica_dir(self, replica_id: str) -> Path:
        return self.settings.replicas_dir / replica_id

    # --- saved state -------------------------------------------------------------------------------------
    def saved(self) -> saved_state.SavedState:
        with self._saved_lock:
            if self._saved is None:
                self._saved = saved_state.ensure_saved_state(
                    self.virt, self.image, self.accel, self.shape, self.settings, self.say
                )
            return self._saved

    # --- bring-up ----------------------------------------------------------------------------------------
    def create(self, mode: Mode | None = None) -> Timed:
        """Provision one replica and bring it to ready; returns how long that took."""
        mode = mode or self.mode
        if mode == "snapshot":
            self.saved()  # made once; not part of any replica's bring-up time
        rid = f"r-{uuid.uuid4().hex[:8]}"
        now = time.time()
        record = ReplicaRecord(
            id=rid,
            image=self.image.name,
            mode=mode,
            created_at=now,
            updated_at=now,
            hostname=f"osfleet-{rid[2:]}",
            machine_id=uuid.uuid4().hex,
        )
        self.replica_dir(rid).mkdir(parents=True)
        self.replica_dir(rid).chmod(0o755)
        self._save(record)
        with self._registry:
            self.records[rid] = record
            self._locks[rid] = threading.Lock()
        start = time.monotonic()
        with self._locked(rid) as rec:
            try:
                self._bring_up(rec, mode)
                rec.move(State.READY)
                self._save(rec)
            except OsfleetError as exc:
                self._fail(rec, f"bring-up failed: {exc}")
                raise
            took = time.monotonic() - start
            self._prepare_standby(rec)
        return Timed(rid, mode, took)

    def up(self, count: int, mode: Mode | None = None) -> list[Timed]:
        return [self.create(mode) for _ in range(count)]

    def up_async(self, count: int, mode: Mode | None = None) -> None:
        """Bring up ``count`` replicas in the background (one at a time: bring-ups compete for CPU)."""
        for _ in range(count):
            self._provisioner.submit(self._create_quietly, mode)

    def _create_quietly(self, mode: Mode | None) -> None:
        try:
            self.create(mode)
        except OsfleetError as exc:
            self.say(f"bring-up failed: {exc}")

    def _bring_up(self, rec: ReplicaRecord, mode: Mode) -> None:
        """Make generation ``rec.generation + 1`` of the replica and wait until it is ready."""
        rec.generation += 1
        rec.domain = domain_name(rec.id, rec.generation)
        disk = self.replica_dir(rec.id) / f"disk-g{rec.generation}.qcow2"
        rec.disk = str(disk)
        meta = {"replica": rec.id, "generation": str(rec.generation), "image": self.image.name}
        if rec.state == State.PROVISIONING:
            rec.move(State.BOOTING)
        if mode == "snapshot":
            state = self.saved()
            rec.layers = [str(state.disk), str(self.image.disk)]
            self._save(rec)
            if not self._take_standby(rec.id, rec.domain):
                saved_state.start_incoming(self.virt, state, self.image, rec.domain, disk, self.shape, meta)
            saved_state.load_memory(self.virt, state, rec.domain)
            self._set_identity(rec)
            shot = self.virt.screenshot(rec.domain)
            if not screen.desktop_drawn(shot, self.image.background, self.image.screen):
                raise OsfleetError(f"{rec.domain}: restored desktop is not drawn")
        else:
            rec.layers = [str(self.image.disk)]
            self._save(rec)
            disk.unlink(missing_ok=True)
            qcow2.create_overlay(disk, self.image.disk)
            spec = replica_spec(self.image, rec.domain, disk, (self.image.disk,), self.accel, self.shape, metadata=meta)
            start = time.monotonic()
            self.virt.start_transient(spec)
            wait_until_ready(self.virt, self.image, rec.domain, start, COLD_BOOT_TIMEOUT_SECONDS)
            self._set_identity(rec)

    # --- standby: the next generation's QEMU, started paused ahead of time -------------------------------
    def _prepare_standby(self, rec: ReplicaRecord) -> None:
        """Start generation ``rec.generation + 1`` paused in the background, so a snapshot reset skips the
        ~0.6 s of starting QEMU. It waits for a migration stream and costs only QEMU's own memory."""
        if rec.mode != "snapshot" or self._stop.is_set():
            return
        rid, gen = rec.id, rec.generation + 1
        name = domain_name(rid, gen)
        disk = self.replica_dir(rid) / f"disk-g{gen}.qcow2"
        meta = {"replica": rid, "generation": str(gen), "image": self.image.name, "role": "standby"}

        def work() -> str | None:
            try:
                saved_state.start_incoming(self.virt, self.saved(), self.image, name, disk, self.shape, meta)
                return name
            except OsfleetError as exc:
                self.say(f"standby for {rid}: {exc}")
                return None

        with self._registry:
            self._standby[rid] = self._standby_pool.submit(work)

    def _take_standby(self, rid: str, name: str) -> bool:
        """Use the prepared standby if it is the generation being made; else discard it."""
        with self._registry:
            future = self._standby.pop(rid, None)
        if future is None:
            return False
        ready = future.result()
        if ready == name and self.virt.is_running(name):
            return True
        if ready is not None:
            self.virt.destroy(ready)
        return False

    def _drop_standby(self, rid: str) -> None:
        with self._registry:
            future = self._standby.pop(rid, None)
        if future is not None and (name := future.result()):
            self.virt.destroy(name)

    def _set_identity(self, rec: ReplicaRecord) -> None:
        """Give the guest its own hostname and machine id, fresh randomness and the right time.

        Restored clones would otherwise share all of them with the saved template; one guest-exec does it
        all (guest-set-time would also write the RTC, which waits for a second boundary).
        """
        self.virt.wait_for_agent(rec.domain, AGENT_TIMEOUT_SECONDS)
        seed = secrets.token_hex(64)
        # Shell builtins only, and one exec (date): every process start is slow in a just-resumed TCG guest.
        script = (
            f"printf %s {rec.hostname} > /proc/sys/kernel/hostname && echo {rec.hostname} > /etc/hostname && "
            f"echo {rec.machine_id} > /etc/machine-id && printf %s {seed} > /dev/urandom && "
            f"exec date -u -s @{time.time():.3f} >/dev/null"
        )
        code, _, err = self.virt.guest_exec(rec.domain, ["/bin/sh", "-c", script], timeout=30)
        if code != 0:
            raise OsfleetError(f"{rec.domain}: setting identity failed: {err.strip()[:200]}")

    # --- resets ------------------------------------------------------------------------------------------
    def reset(self, replica_id: str, mode: Mode | None = None) -> Timed:
        """Bring the replica back to its exact initial state (a new generation); keeps its lease."""
        with self._locked(replica_id) as rec:
            if rec.state not in RUNNING_STATES:
                raise ReplicaBusyError(f"replica {replica_id} is {rec.state}; only ready or leased replicas reset")
            mode = mode or self.mode
            if mode != "snapshot":
                self._drop_standby(replica_id)
            leased = rec.state == State.LEASED
            old_domain, old_disk = rec.domain, rec.disk
            start = time.monotonic()
            rec.move(State.RESETTING)
            self._save(rec)
            # Pause the old generation now (it stops competing for CPU) and destroy it once the new one is
            # ready: tearing QEMU down takes 1-2 s that need not be on the reset's critical path.
            with contextlib.suppress(OsfleetError, libvirt.libvirtError):
                self.virt.domain(old_domain).suspend()
            try:
                self._bring_up(rec, mode)
            except OsfleetError as exc:
                self._retire_generation(old_domain, Path(old_disk))
                self._fail(rec, f"reset failed: {exc}")
                raise
            self._retire_generation(old_domain, Path(old_disk))
            rec.move(State.LEASED if leased else State.READY)
            self._save(rec)
            self.counters["resets"] += 1
            took = time.monotonic() - start
            self._prepare_standby(rec)
            return Timed(replica_id, mode, took)

    def _retire_generation(self, domain: str, disk: Path) -> None:
        """Destroy an old generation's domain and disk in the background (off the reset's critical path)."""

        def work() -> None:
            self.virt.destroy(domain)
            disk.unlink(missing_ok=True)

        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._cleanup.submit(work))

    # --- failures ----------------------------------------------------------------------------------------
    def _fail(self, rec: ReplicaRecord, reason: str) -> None:
        if rec.state != State.FAILED:
            rec.move(State.FAILED, error=reason)
            self._save(rec)
            self.counters["failures_detected"] += 1
            self.say(f"replica {rec.id} failed: {reason}")

    def check(self) -> list[str]:
        """Mark replicas whose domain is gone as failed; returns their ids. Cheap: one libvirt call each."""
        failed = []
        for rec in self.replicas():
            if rec.state in RUNNING_STATES and not self.virt.is_running(rec.domain):
                try:
                    with self._locked(rec.id) as live:
                        if live.state in RUNNING_STATES and not self.virt.is_running(live.domain):
                            self._fail(live, "the replica's QEMU process is gone")
                            failed.append(live.id)
                except ReplicaNotFoundError:
                    continue
        return failed

    def recover(self, replica_id: str) -> Timed:
        """Rebuild a failed replica: new overlay, new domain, same identity; its lease ends."""
        with self._locked(replica_id) as rec:
            if rec.state != State.FAILED:
                raise ReplicaBusyError(f"replica {replica_id} is {rec.state}, not failed")
            start = time.monotonic()
            rec.move(State.RECOVERING, error=rec.error)
            rec.lease = None
            self._save(rec)
            self._drop_standby(replica_id)
            self._retire_generation(rec.domain, Path(rec.disk))
            try:
                self._bring_up(rec, rec.mode)  # type: ignore[arg-type]
            except OsfleetError as exc:
                rec.move(State.FAILED, error=f"recovery failed: {exc}")
                self._save(rec)
                raise
            rec.move(State.READY)
            self._save(rec)
            self.counters["recoveries"] += 1
            took = time.monotonic() - start
            self._prepare_standby(rec)
            return Timed(replica_id, rec.mode, took)  # type: ignore[arg-type]

    # --- retirement --------------------------------------------------------------------------------------
    def retire(self, replica_id: str) -> None:
        with self._locked(replica_id) as rec:
            rec.move(State.RETIRED)
            self._save(rec)
            self._drop_standby(rec.id)
            self._destroy_all(rec.id)
            shutil.rmtree(self.replica_dir(rec.id), ignore_errors=True)
            self.store.delete(rec.id)
        with self._registry:
            self.records.pop(replica_id, None)
            self._locks.pop(replica_id, None)

    def _destroy_all(self, replica_id: str) -> None:
        for name in self.virt.names(f"{NAME_PREFIX}{replica_id}-"):
            self.virt.destroy(name)

    def down(self, ids: list[str] | None = None) -> int:
        """Retire the given replicas (all when None) in parallel; returns how many."""
        targets = ids if ids is not None else [r.id for r in self.replicas()]
        self.drain_cleanup()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(self.retire, targets))
        return len(targets)

    # --- adoption after a restart ----------------------------------------------------------------------
    def adopt(self) -> AdoptReport:
        """Rebuild the view from records + libvirt: keep live replicas, clean half-made ones and orphans.

        Replicas another live process manages (a running host agent, a benchmark) are left alone, and a
        record is read again before anything of its replica is destroyed: another process may have
        created it since the records were listed.
        """
        report = AdoptReport()
        records, broken = self.store.load_all()
        for path in broken:
            path.unlink(missing_ok=True)
        running = set(self.virt.names(REPLICA_PREFIX))
        for rec in records:
            if rec.image != self.image.name:
                continue  # another image's host agent owns it
            if owned_by_other_live_process(rec):
                report.foreign.append(rec.id)
                continue
            if rec.state == State.RETIRED or rec.state in TRANSIENT_STATES:
                self._destroy_all(rec.id)
                shutil.rmtree(self.replica_dir(rec.id), ignore_errors=True)
                self.store.delete(rec.id)
                report.cleaned.append(rec.id)
                continue
            with self._registry:
                self.records[rec.id] = rec
                self._locks[rec.id] = threading.Lock()
            if rec.state in RUNNING_STATES and rec.domain not in running:
                self._fail(rec, "the replica's domain disappeared while no host agent was running")
                report.failed.append(rec.id)
            elif rec.state == State.FAILED:
                report.failed.append(rec.id)
            else:
                report.kept.append(rec.id)
        current = {r.domain for r in self.records.values()}
        for name in running - current:
            owner = name[len(NAME_PREFIX) :].rsplit("-g", 1)[0]
            if owner in self.records or self._unclaimed(owner):
                self.virt.destroy(name)
                report.orphan_domains.append(name)
        if self.settings.replicas_dir.exists():
            for d in self.settings.replicas_dir.iterdir():
                if d.is_dir() and d.name.startswith("r-") and d.name not in self.records and self._unclaimed(d.name):
                    shutil.rmtree(d, ignore_errors=True)
        return report

    def _unclaimed(self, replica_id: str) -> bool:
        """No record of this replica exists now (read again, not from an earlier listing)."""
        try:
            ReplicaRecord.model_validate_json(self.store.path(replica_id).read_text())
        except (OSError, ValueError):
            return True
        return False

    # --- leases ------------------------------------------------------------------------------------------
    def lease(self, holder: str, seconds: float = DEFAULT_LEASE_SECONDS) -> tuple[ReplicaRecord, Lease]:
        """Hand out a ready replica (never one still booting)."""
        for rec in self.replicas():
            if rec.state != State.READY:
                continue
            try:
                with self._locked(rec.id) as live:
                    if live.state != State.READY:
                        continue
                    live.lease = Lease(id=uuid.uuid4().hex, holder=holder, expires_at=time.time() + seconds)
                    live.move(State.LEASED)
                    self._save(live)
                    return live.model_copy(deep=True), live.lease
            except ReplicaNotFoundError:
                continue
        raise NoReplicaAvailableError("no ready replica to lease; try again shortly")

    def check_lease(self, replica_id: str, lease_id: str) -> ReplicaRecord:
        rec = self.get(replica_id)
        if self._expired.get(lease_id) == replica_id:
            raise LeaseError(f"lease {lease_id} on replica {replica_id} has expired")
        if rec.lease is None or rec.lease.id != lease_id:
            raise LeaseError(f"lease {lease_id} does not hold replica {replica_id}")
        if rec.lease.expired():
            raise LeaseError(f"lease {lease_id} on replica {replica_id} has expired")
        return rec

    def release(self, replica_id: str, lease_id: str, reset: bool = True) -> None:
        """End a lease; the replica is reset to its initial state before anyone else gets it."""
        with self._locked(replica_id) as rec:
            if rec.lease is None or rec.lease.id != lease_id:
                raise LeaseError(f"lease {lease_id} does not hold replica {replica_id}")
            rec.lease = None
            if rec.state == State.LEASED:
                rec.move(State.READY)
            self._save(rec)
        if reset:
            self.reset(replica_id)

    # --- observe and act -------------------------------------------------------------------------------
    def _running(self, replica_id: str) -> ReplicaRecord:
        rec = self.get(replica_id)
        if rec.state not in RUNNING_STATES:
            raise ReplicaBusyError(f"replica {replica_id} is {rec.state}")
        return rec

    def screenshot(self, replica_id: str, fmt: str = "png") -> bytes:
        rec = self._running(replica_id)
        image = self.virt.screenshot(rec.domain)
        buf = io.BytesIO()
        if fmt == "jpeg":
            image.save(buf, "JPEG", quality=85)
        elif fmt == "png":
            image.save(buf, "PNG", compress_level=1)
        else:
            raise OsfleetError(f"unknown screenshot format {fmt!r} (png or jpeg)")
        return buf.getvalue()

    def act(self, replica_id: str, actions: list[Action]) -> list[ActionResult]:
        rec = self._running(replica_id)
        return run_actions(self.virt, rec.domain, self.image.screen, actions)

    def rss_bytes(self, replica_id: str) -> int | None:
        return self.virt.rss_bytes(self.get(replica_id).domain)

    # --- background loops ------------------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        while not self._stop.wait(MONITOR_INTERVAL_SECONDS):
            try:
                for rid in self.check():
                    if self.auto_recover and not self._stop.is_set():
                        self.recover(rid)
                for rec in self.replicas():
                    if rec.state == State.LEASED and rec.lease is not None and rec.lease.expired():
                        self._expired[rec.lease.id] = rec.id
                        while len(self._expired) > EXPIRED_LEASES_REMEMBERED:
                            self._expired.popitem(last=False)
                        self.release(rec.id, rec.lease.id)
            except OsfleetError as exc:
                self.say(f"monitor: {exc}")

    def _pool_loop(self) -> None:
        while not self._stop.wait(0.2):
            ready = sum(1 for r in self.replicas() if r.state in (State.READY, State.BOOTING, State.PROVISIONING))
            if ready < self.warm:
                try:
                    self.create()
                except OsfleetError as exc:
                    self.say(f"warm pool: {exc}")
                    self._stop.wait(5)


def teardown_all(settings: Settings, states: bool = False, force: bool = False) -> tuple[int, int]:
    """Remove every replica domain and file osfleet made on this host, whatever image it came from.

    Found by name prefix and in osfleet's own directories only. Returns (domains destroyed, records removed).
    Refuses while another process manages replicas here, unless ``force``.
    """
    records, _ = RecordStore(settings.replicas_dir).load_all()
    busy = sorted({r.owner_pid for r in records if owned_by_other_live_process(r)})
    if busy and not force:
        raise OsfleetError(
            f"replicas here are managed by running process(es) {', '.join(map(str, busy))}: "
            "stop them first, or pass --force"
        )
    with Virt(settings.libvirt_uri) as virt:
        names = virt.names(REPLICA_PREFIX) + virt.names(f"{NAME_PREFIX}template-")
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(virt.destroy, names))
    removed = 0
    if settings.replicas_dir.exists():
        removed = len(list(settings.replicas_dir.glob("*.json")))
        shutil.rmtree(settings.replicas_dir)
    if states:
        saved_state.remove_saved_states(settings)
    return len(names), removed
