"""The replica host's parts alone, with no VM: the lease book, the monitor, the error boundary, adoption.

Each test here failed against the code before the hardening issue (release marked the replica ready
before resetting it; the monitor ran recoveries inline; non-osfleet errors left replicas `resetting`).
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import libvirt
import pytest

from osfleet.config import Settings
from osfleet.errors import DiskFullError, GuestTimeoutError, HostIOError, InternalError, OsfleetError, VirtError
from osfleet.protocol.models import Mode
from osfleet.replicas import leases
from osfleet.replicas.adoption import adopt
from osfleet.replicas.errors import LeaseLostError, NoReplicaAvailableError
from osfleet.replicas.generations import Generations
from osfleet.replicas.leases import LeaseBook
from osfleet.replicas.lifecycle import Lifecycle
from osfleet.replicas.liveness import Liveness
from osfleet.replicas.monitor import Monitor
from osfleet.replicas.pool import WarmPool
from osfleet.replicas.records import Lease, RecordStore, ReplicaRecord, State
from osfleet.replicas.registry import Registry
from osfleet.vm.virt import Virt
from tests.fakes import FakeImage

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.

WAIT = 10.0  # upper bound for anything that should happen "at once" in these tests


def ready_record(rid: str, state: State = State.READY, lease: Lease | None = None) -> ReplicaRecord:
    rec = ReplicaRecord(id=rid, image="golden-fake", mode="snapshot", created_at=time.time(), domain=f"dom-{rid}")
    rec.move(State.BOOTING)
    rec.move(State.READY)
    if state == State.LEASED:
        rec.lease = lease or Lease(id=f"lease-{rid}", holder="a", expires_at=time.time() + 600)
        rec.move(State.LEASED)
    return rec


def registry_with(tmp_path: Path, *records: ReplicaRecord) -> Registry:
    reg = Registry(RecordStore(tmp_path / "replicas"))
    for rec in records:
        reg.save(rec)
        reg.add(rec)
    return reg


# --- bug 1: release -> lease race ----------------------------------------------------------------------------
@pytest.mark.integration
def test_a_released_replica_cannot_be_leased_until_its_reset_is_done(tmp_path: Path) -> None:
    reg = registry_with(tmp_path, ready_record("r-1", State.LEASED))
    started, finish = threading.Event(), threading.Event()

    def slow_reset(rec: ReplicaRecord, then: State) -> None:
        rec.move(State.RESETTING)
        reg.save(rec)
        started.set()
        assert finish.wait(WAIT)
        rec.move(then)
        reg.save(rec)

    book = LeaseBook(reg, slow_reset)
    releasing = threading.Thread(target=book.release, args=("r-1", "lease-r-1"))
    releasing.start()
    assert started.wait(WAIT)
    with pytest.raises(NoReplicaAvailableError):
        book.lease("b")  # the dirty replica is not handed out, and lease() does not wait for the reset
    assert reg.get("r-1").state == State.RESETTING
    assert RecordStore(tmp_path / "replicas").load_all()[0][0].state == State.RESETTING  # a restart sees it too
    finish.set()
    releasing.join(WAIT)
    rec, lease = book.lease("b")
    assert rec.id == "r-1" and lease.holder == "b"


@pytest.mark.integration
@pytest.mark.parametrize(("held", "leased"), [(0.5, True), (leases.BUSY_READY_WAIT_SECONDS + 2, False)])
def test_a_ready_replica_busy_for_a_moment_is_waited_for(tmp_path: Path, held: float, leased: bool) -> None:
    """CI's lease right after the warm replica came up met its lock held while it was parked and got 503
    with a replica ready for it: the lease waits a moment for such a replica (never for a reset)."""
    reg = registry_with(tmp_path, ready_record("r-1"))
    book = LeaseBook(reg, lambda rec, then: None)
    holding, t0 = threading.Event(), time.monotonic()

    def park_slowly() -> None:
        with reg.locked("r-1"):
            holding.set()
            time.sleep(held)

    parker = threading.Thread(target=park_slowly)
    parker.start()
    assert holding.wait(WAIT)
    if leased:
        rec, lease = book.lease("b")
        assert rec.id == "r-1" and lease.holder == "b" and reg.get("r-1").state == State.LEASED
    else:
        with pytest.raises(NoReplicaAvailableError):
            book.lease("b")
        assert reg.get("r-1").state == State.READY
    took = time.monotonic() - t0
    parker.join(WAIT)
    assert took < leases.BUSY_READY_WAIT_SECONDS + 1, took


@pytest.mark.integration
def test_release_and_lease_raced_many_times_never_share_a_replica(tmp_path: Path) -> None:
    reg = registry_with(tmp_path, *(ready_record(f"r-{i}") for i in range(3)))
    resets: list[str] = []

    def reset(rec: ReplicaRecord, then: State) -> None:
        rec.move(State.RESETTING)
        time.sleep(0.001)
        resets.append(rec.id)
        rec.move(then)

    book = LeaseBook(reg, reset)
    holders: dict[str, str] = {}
    problems: list[str] = []
    guard = threading.Lock()

    def agent(name: str) -> None:
        for _ in range(60):
            try:
                rec, lease = book.lease(name)
            except NoReplicaAvailableError:
                continue
            with guard:
                if rec.id in holders:
                    problems.append(f"{rec.id} leased by {name} while {holders[rec.id]} holds it")
                holders[rec.id] = name
            with guard:
                holders.pop(rec.id, None)
            book.release(rec.id, lease.id)

    threads = [threading.Thread(target=agent, args=(f"agent-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert problems == []
    assert len(resets) > 0 and all(r.state == State.READY for r in reg.all())


@pytest.mark.integration
def test_a_failed_reset_after_release_leaves_the_replica_failed_not_ready(tmp_path: Path) -> None:
    reg = registry_with(tmp_path, ready_record("r-1", State.LEASED))

    def broken(rec: ReplicaRecord, then: State) -> None:
        rec.move(State.RESETTING)
        reg.fail(rec, "reset failed: boom")
        raise OsfleetError("boom")

    book = LeaseBook(reg, broken)
    assert book.release("r-1", "lease-r-1") is False
    assert reg.get("r-1").state == State.FAILED and reg.get("r-1").lease is None
    with pytest.raises(NoReplicaAvailableError):
        book.lease("b")


# --- bug 2: the monitor keeps its period while recoveries run -------------------------------------------------
@pytest.mark.integration
def test_detection_goes_on_while_a_slow_recovery_runs(tmp_path: Path) -> None:
    failures: list[list[str]] = [["slow"], [], ["fast"]]
    release_slow = threading.Event()
    recovered: list[str] = []

    def detect() -> list[str]:
        return failures.pop(0) if failures else []

    def recover(rid: str) -> None:
        if rid == "slow":
            assert release_slow.wait(WAIT)
        recovered.append(rid)

    mon = Monitor(detect, recover, expired=list, expire=lambda r, lid: None, interval=0.02, workers=2)
    mon.start()
    try:
        deadline = time.monotonic() + WAIT
        while "fast" not in recovered and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recovered == ["fast"], "the second failure waited for the first recovery"
        ticks = mon.ticks
        time.sleep(0.2)
        assert mon.ticks > ticks + 3, "detection stopped while a recovery was running"
    finally:
        release_slow.set()
        mon.stop()
    assert recovered == ["fast", "slow"]


@pytest.mark.integration
def test_recoveries_are_bounded_and_not_queued_twice(tmp_path: Path) -> None:
    gate = threading.Event()
    running, most, calls = [0], [0], []
    lock = threading.Lock()

    def recover(rid: str) -> None:
        with lock:
            calls.append(rid)
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(WAIT)
        with lock:
            running[0] -= 1

    rounds = [["a", "b", "c", "d"]] * 5  # the same failures seen again while their recoveries are under way

    mon = Monitor(lambda: rounds.pop() if rounds else [], recover, list, lambda r, lid: None, interval=0.01)
    mon.start()
    deadline = time.monotonic() + WAIT
    while rounds and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not rounds
    while time.monotonic() < deadline and running[0] < 2:  # both workers picked up their job
        time.sleep(0.01)
    # A wrongly started third job would show within the monitor's next rounds (it submits on its own thread):
    # wait for ten more of them rather than for a time, which a slow machine could spend before any round ran.
    ticks = mon.ticks
    while time.monotonic() < deadline and mon.ticks < ticks + 10:
        time.sleep(0.01)
    assert mon.ticks >= ticks + 10 and mon.busy() == 4  # c and d queued behind a and b, none dropped
    with lock:
        assert running[0] == 2 and sorted(calls) == ["a", "b"]  # two at a time; c and d wait their turn
    gate.set()
    while time.monotonic() < deadline and mon.busy():  # (stop drops queued jobs: let c and d run first)
        time.sleep(0.01)
    mon.stop()
    assert most[0] == 2 and sorted(calls) == ["a", "b", "c", "d"]  # each once, though seen five times


@pytest.mark.integration
def test_the_monitor_survives_a_failing_detection_round() -> None:
    rounds = [0]

    def detect() -> list[str]:
        rounds[0] += 1
        if rounds[0] == 1:
            raise RuntimeError("libvirt went away for a moment")
        return []

    mon = Monitor(detect, None, list, lambda r, lid: None, interval=0.01)
    mon.start()
    deadline = time.monotonic() + WAIT
    while rounds[0] < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mon.alive() and rounds[0] >= 5
    mon.stop()
    assert not mon.alive()


@pytest.mark.integration
def test_the_warm_pool_keeps_going_after_a_failed_bring_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("osfleet.replicas.pool.BACKOFF_SECONDS", 0.01)
    made: list[int] = []

    def create() -> None:
        if not made:
            made.append(0)
            raise RuntimeError("first bring-up fails")
        made.append(1)

    pool = WarmPool(1, lambda: made.count(1), create)
    pool.start()
    deadline = time.monotonic() + WAIT
    while made.count(1) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.alive() and made == [0, 1]
    pool.stop()
    assert not pool.alive()


# --- bug 3: every error ends as an osfleet error, and the replica failed ------------------------------------
class FakeVirt:
    def __init__(self) -> None:
        self.running: set[str] = set()

    def suspend(self, name: str) -> None:
        pass

    def is_running(self, name: str) -> bool:
        return name in self.running


class FakeGenerations:
    def __init__(self, tmp_path: Path, error: BaseException | None) -> None:
        self.virt = FakeVirt()
        self.image = FakeImage()
        self.error = error
        self.retired: list[str] = []
        self.dir = tmp_path / "replicas"

    def replica_dir(self, rid: str) -> Path:
        return self.dir / rid

    def saved(self) -> None:
        pass

    def bring_up(self, rec: ReplicaRecord, mode: Mode) -> None:
        rec.generation += 1
        rec.domain = f"dom-{rec.id}-g{rec.generation}"
        if self.error is not None:
            raise self.error
        self.virt.running.add(rec.domain)

    def retire_generation(self, domain: str, disk: Path) -> None:
        self.retired.append(domain)

    def drop_standby(self, rid: str) -> None:
        pass

    def prepare_standby(self, rec: ReplicaRecord) -> None:
        pass

    def spare_ready(self, rid: str) -> bool:
        return False

    def destroy(self, name: str) -> bool:
        self.virt.running.discard(name)
        return True


@pytest.mark.integration
@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/srv/r-1/disk-g2.qcow2"), DiskFullError),
        (OSError(errno.EACCES, "Permission denied"), HostIOError),
        (libvirt.libvirtError("internal error: qemu unexpectedly closed the monitor"), VirtError),
        (RuntimeError("a bug"), InternalError),
        (VirtError("QMP migrate-incoming failed"), VirtError),
    ],
)
def test_any_error_during_a_reset_marks_the_replica_failed(tmp_path: Path, error: BaseException, kind: type) -> None:
    reg = registry_with(tmp_path, ready_record("r-1", State.LEASED))
    gen = FakeGenerations(tmp_path, error)
    life = Lifecycle(reg, gen, "snapshot")  # type: ignore[arg-type]
    with pytest.raises(kind):
        life.reset("r-1")
    rec = reg.get("r-1")
    assert rec.state == State.FAILED and "reset failed" in (rec.error or "")
    assert RecordStore(tmp_path / "replicas").load_all()[0][0].state == State.FAILED
    assert gen.retired == ["dom-r-1"]  # the old generation is cleaned up, not leaked
    assert reg.counters["bringup_retries"] == 1  # a second generation was tried before giving up
    assert life.detect() == ["r-1"]  # due for recovery at once
    gen.error = None
    life.recover("r-1")
    assert reg.get("r-1").state == State.READY and reg.counters["recoveries"] == 1


@pytest.mark.integration
def test_a_record_that_cannot_be_written_still_fails_the_replica_in_memory(tmp_path: Path) -> None:
    reg = registry_with(tmp_path, ready_record("r-1", State.LEASED))
    gen = FakeGenerations(tmp_path, OSError(errno.ENOSPC, "No space left on device"))
    life = Lifecycle(reg, gen, "snapshot")  # type: ignore[arg-type]

    def disk_full(record: ReplicaRecord) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path))

    reg.store.save = disk_full  # type: ignore[method-assign]
    with pytest.raises(DiskFullError):
        life.reset("r-1")
    assert reg.get("r-1").state == State.FAILED


@pytest.mark.integration
def test_a_failed_recovery_is_retried_later_not_every_second(tmp_path: Path) -> None:
    reg = registry_with(tmp_path, ready_record("r-1"))
    gen = FakeGenerations(tmp_path, RuntimeError("still broken"))
    life = Lifecycle(reg, gen, "snapshot")  # type: ignore[arg-type]
    with reg.locked("r-1") as rec:
        reg.fail(rec, "the replica's QEMU process is gone")
    assert life.detect() == ["r-1"]
    with pytest.raises(InternalError):
        life.recover("r-1")
    assert reg.get("r-1").state == State.FAILED and reg.get("r-1").error.startswith("recovery failed")  # type: ignore[union-attr]
    assert life.detect() == []  # backs off


# --- two processes adopting at once -------------------------------------------------------------------------
def _adopt_in_child(home: str, out: Any, done: Any) -> None:
    settings = Settings(home=Path(home), libvirt_uri="test:///default")
    reg = Registry(RecordStore(settings.replicas_dir))
    with Virt(settings.libvirt_uri) as virt:
        gen = Generations(virt, FakeImage(), "qemu", None, settings, lambda m: None)  # type: ignore[arg-type]
        report = adopt(reg, gen)
        out.put((os.getpid(), sorted(report.kept + report.failed), sorted(report.foreign)))
        done.wait(WAIT)
        gen.close()


@pytest.mark.system
def test_two_processes_adopting_at_once_never_both_take_a_replica(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "replicas")
    ids = [f"r-{i}" for i in range(8)]
    for rid in ids:
        rec = ready_record(rid)
        rec.owner_pid = 2**22 + 7  # a process that is gone
        store.save(rec)
    ctx = multiprocessing.get_context("fork")
    out, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_adopt_in_child, args=(str(tmp_path), out, done)) for _ in range(2)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=WAIT * 3) for _ in procs]
    owners = {r.owner_pid for r in store.load_all()[0]}
    done.set()
    for p in procs:
        p.join(WAIT)
    taken = [r[1] for r in reports]
    assert sorted(taken[0] + taken[1]) == ids, "every replica adopted exactly once"
    assert [] in taken and ids in taken
    assert {r[0] for r in reports if r[1]} == owners


# --- faults that leave QEMU running: a deleted overlay, a frozen guest; a lease that ends by failure -------
@pytest.mark.integration
def test_a_deleted_overlay_or_a_silent_guest_fails_the_replica_and_its_lease_ends_as_lost(tmp_path: Path) -> None:
    overlay = tmp_path / "disk-g1.qcow2"
    overlay.write_bytes(b"qcow")
    rec = ready_record("r-1", State.LEASED)
    rec.disk = str(overlay)
    reg = registry_with(tmp_path, rec, ready_record("r-2"))
    gen = FakeGenerations(tmp_path, None)
    gen.virt.running |= {"dom-r-1", "dom-r-2"}
    lost: dict[str, str] = {}
    life = Lifecycle(reg, gen, "snapshot", on_lease_lost=lost.__setitem__)  # type: ignore[arg-type]
    book = LeaseBook(reg, lambda r, then: None)
    assert life.detect() == []
    overlay.unlink()
    assert life.detect() == ["r-1"] and "overlay" in (reg.get("r-1").error or "")
    assert reg.get("r-2").state == State.READY  # nothing else touched
    life.recover("r-1")
    assert list(lost) == ["lease-r-1"] and "failed" in lost["lease-r-1"]
    book.note_lost("lease-r-1", lost["lease-r-1"])
    with pytest.raises(LeaseLostError, match="lease lease-r-1 ended"):
        book.check("r-1", "lease-r-1")


class SilentVirt:
    def __init__(self) -> None:
        self.answering = {"dom-a": True, "dom-b": False}
        self.pids: dict[str, int] = {}

    def qemu_pid(self, domain: str) -> int | None:
        return self.pids.get(domain)

    def agent(self, domain: str, command: str, timeout: int = 5) -> None:
        if not self.answering[domain]:
            raise GuestTimeoutError(f"{domain}: guest agent did not answer")


@pytest.mark.integration
def test_liveness_names_a_guest_that_stops_answering_after_several_misses() -> None:
    live = Liveness(SilentVirt(), every=0.0, misses=3)  # type: ignore[arg-type]
    try:
        for round_ in range(1, 4):
            live.probe(["dom-a", "dom-b"])
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline and live._inflight:
                time.sleep(0.01)
            assert live.dead() == (set() if round_ < 3 else {"dom-b"})
        live.probe(["dom-a"])  # dom-b is gone (rebuilt under another name): forgotten
        assert live.dead() == set()
    finally:
        live.close()


@pytest.mark.integration
def test_liveness_keeps_watching_a_domain_whose_ping_raised_a_foreign_error() -> None:
    """A ping that raised something not osfleet's own (a binding's ``ValueError``) is a miss like any other:
    the domain is probed again and named dead after enough of them, never forgotten as "in flight"."""

    class OddVirt(SilentVirt):
        def agent(self, domain: str, command: str, timeout: int = 5) -> None:
            raise ValueError("a reply libvirt-python could not decode")

    live = Liveness(OddVirt(), every=0.0, misses=3)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            live.probe(["dom-a"])
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline and live._inflight:
                time.sleep(0.01)
            assert not live._inflight
        assert live.dead() == {"dom-a"}
    finally:
        live.close()


@pytest.mark.system
def test_liveness_names_a_stopped_qemu_without_waiting_for_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import subprocess

    monkeypatch.setattr("osfleet.replicas.liveness.STOPPED_SECONDS", 0.2)
    virt = SilentVirt()
    virt.answering["dom-c"] = True
    stand_in = subprocess.Popen(["sleep", "60"])  # stands in for a QEMU process
    try:
        virt.pids["dom-c"] = stand_in.pid
        live = Liveness(virt, every=0.0, misses=99)  # type: ignore[arg-type]
        live.probe(["dom-c"])
        assert live.dead() == set()
        stand_in.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and "dom-c" not in live.dead():
            live.probe(["dom-c"])
            time.sleep(0.05)
        assert live.dead() == {"dom-c"}
        stand_in.send_signal(signal.SIGCONT)
        live.probe(["dom-c"])
        assert live.dead() == set()
        live.close()
    finally:
        stand_in.kill()
        stand_in.wait()


@pytest.mark.integration
def test_a_task_reset_skips_a_generation_nothing_acted_on_but_never_a_used_one(tmp_path: Path) -> None:
    reg = registry_with(tmp_path, ready_record("r-1", State.LEASED))
    life = Lifecycle(reg, FakeGenerations(tmp_path, None), "snapshot")  # type: ignore[arg-type]
    assert life.reset("r-1", unless_pristine=True).seconds >= 0 and reg.get("r-1").generation == 1  # unknown: reset
    assert life.reset("r-1", unless_pristine=True).seconds == 0.0 and reg.get("r-1").generation == 1  # as made
    life.mark_used("r-1", 1)  # an action reached the guest
    life.reset("r-1", unless_pristine=True)
    assert reg.get("r-1").generation == 2 and reg.counters["resets"] == 2
    life.reset("r-1", mode="cold", unless_pristine=True)  # another mode is a real reset
    assert reg.get("r-1").generation == 3
