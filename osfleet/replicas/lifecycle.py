"""A replica's life: bring-up, resets, failure detection, recovery and retirement.

Each operation takes the replica's lock for its whole length, and whatever goes wrong in it (libvirt, a
full disk, a bug) ends with the replica marked failed, never stuck in ``resetting`` or ``recovering``:
the monitor then rebuilds it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from osfleet.errors import OsfleetError, as_osfleet
from osfleet.measure.timing import collecting, stage
from osfleet.protocol.models import Mode
from osfleet.replicas import guest_clock
from osfleet.replicas.errors import LeaseError, ReplicaBusyError, ReplicaNotFoundError
from osfleet.replicas.forks import Forks, Saved, Slot, image_changed
from osfleet.replicas.generations import Generations
from osfleet.replicas.liveness import Liveness
from osfleet.replicas.records import RUNNING_STATES, Lease, ReplicaRecord, State
from osfleet.replicas.registry import Registry
from osfleet.replicas.saved_state import SavedState
from osfleet.vm.tenant_storage import private_dir

log = logging.getLogger(__name__)

# A replica whose recovery failed is tried again after this long (a failing host is not hammered).
RECOVERY_RETRY_SECONDS = 30.0
# A generation that does not come up (a boot stuck at a bare background, a restore that failed) is
# replaced by a new one this many times in all before the operation fails (counted: ``bringup_retries``).
BRINGUP_ATTEMPTS = 2


@dataclass(frozen=True)
class Timed:
    """How long a bring-up or reset took until the replica was ready, and in which mode (and the generation
    it is on after it)."""

    replica: str
    mode: Mode
    seconds: float
    generation: int = 0


Grant = Callable[[ReplicaRecord], Lease]
Check = Callable[[ReplicaRecord], None]
"""Raises unless the caller may touch the replica now (its lease holds): run under the replica's lock."""
# Children of one fork load one fewer at a time than the host has cores (at least one): a core stays for the
# children already running and for libvirt. Measured on 2 cores (osfleet bench fork --children 8): one at a
# time gave a child p50 of 0.16-0.20 s and all 8 in 3.5-4.3 s; two at a time 0.21-0.26 s and 3.7-3.9 s.
FORK_WORKERS = max(1, (os.cpu_count() or 1) - 1)
# A child that runs while its siblings load would take their cores: a freshly restored TCG guest translates
# its code again and keeps a core busy for a while. Its vCPUs run at this nice value until every sibling runs
# (measured: loads of the later children took 100-250 ms instead of 30-70 ms behind running siblings).
CHILD_LOADING_NICE = 19


@dataclass(frozen=True)
class Child:
    """A fork's child: its record when it became ready, its lease (if granted), its bring-up seconds."""

    record: ReplicaRecord
    lease: Lease | None
    seconds: float
    stages: dict[str, float] = field(default_factory=dict)  # where its bring-up went (osfleet.measure.timing)


@dataclass(frozen=True)
class Forked:
    """The result of a fork: the saved fork, how long the parent's save and the whole fork took, the children."""

    parent: str
    fork_id: str
    memory_mode: str
    save_seconds: float
    total_seconds: float
    children: list[Child]
    paused_seconds: float = 0.0  # how long the parent stood still (inside save_seconds)


class Lifecycle:
    """Bring-up, reset, recovery and retirement of the replicas in ``registry``."""

    def __init__(
        self,
        registry: Registry,
        generations: Generations,
        default_mode: Mode,
        liveness: Liveness | None = None,
        on_lease_lost: Callable[[str, str], None] | None = None,
        forks: Forks | None = None,
        park: bool = False,
    ) -> None:
        """``park``: pause every replica that becomes ready until it is leased (``park_locked``)."""
        self.registry = registry
        self.gen = generations
        self.default_mode: Mode = default_mode
        self.liveness = liveness
        self.on_lease_lost = on_lease_lost or (lambda _lease, _why: None)
        self.forks = forks
        self.park = park
        self._pristine: set[tuple[str, int]] = set()
        self._pristine_lock = threading.Lock()

    # --- bring-up ------------------------------------------------------------------------------------------
    def create(self, mode: Mode | None = None) -> Timed:
        """Provision one replica and bring it to ready; returns how long that took."""
        mode = mode or self.default_mode
        if mode == "snapshot":
            self.gen.saved()  # made once; not part of any replica's bring-up time
        rid = self._new_record(mode)
        start = time.monotonic()
        with self.registry.locked(rid) as rec:
            try:
                self._bring_up(rec, mode)
                self._note_pristine(rec)
                rec.move(State.READY)
                self.registry.save(rec)
            except Exception as exc:
                err = as_osfleet(exc, f"bringing up {rid}")
                self.registry.fail(rec, f"bring-up failed: {err}")
                raise err from exc
            took = time.monotonic() - start
            self.gen.prepare_standby(rec)
            self._maybe_park(rec)
        return Timed(rid, mode, took)

    def _new_record(self, mode: Mode, rid: str | None = None, identity: tuple[str, str] | None = None) -> str:
        """A new replica's directory and record (provisioning), registered; returns its id. ``rid``: an id
        reserved earlier (a fork slot, whose directory exists); ``identity``: (hostname, machine id) it
        inherits (a fork's child is an exact copy of its parent)."""
        reserved = rid is not None
        rid = rid or f"r-{uuid.uuid4().hex[:8]}"
        now = time.time()
        hostname, machine_id = identity or (f"osfleet-{rid[2:]}", uuid.uuid4().hex)
        record = ReplicaRecord(
            id=rid,
            image=self.gen.image.name,
            mode=mode,
            created_at=now,
            updated_at=now,
            hostname=hostname,
            machine_id=machine_id,
        )
        try:
            directory = self.gen.replica_dir(rid)
            directory.mkdir(parents=True, exist_ok=reserved)
            private_dir(directory, self.gen.virt.qemu_ids())  # its disks and episode are its tenant's
        except OSError as exc:
            raise as_osfleet(exc, f"creating replica {rid}") from exc
        try:
            self.registry.save(record)
        except OsfleetError:
            shutil.rmtree(self.gen.replica_dir(rid), ignore_errors=True)
            raise
        self.registry.add(record)
        return rid

    def _bring_up(self, rec: ReplicaRecord, mode: Mode) -> None:
        """``Generations.bring_up``, with a failed generation torn down and made again (the caller holds
        the lock). Each attempt is a new generation, so nothing of the failed one is reused."""
        for attempt in range(1, BRINGUP_ATTEMPTS + 1):
            try:
                self.gen.bring_up(rec, mode)
                return
            except Exception as exc:
                if attempt == BRINGUP_ATTEMPTS:
                    raise
                err = as_osfleet(exc, f"bringing up generation {rec.generation} of {rec.id}")
                log.warning(
                    "replica %s: generation %d did not come up (%s); making a new one", rec.id, rec.generation, err
                )
                self.registry.counters.inc("bringup_retries")
                self.gen.drop_standby(rec.id)
                with contextlib.suppress(OsfleetError):
                    self.gen.destroy(rec.domain)
                with contextlib.suppress(OSError):
                    Path(rec.disk).unlink(missing_ok=True)

    # --- forks ---------------------------------------------------------------------------------------------
    def fork(
        self,
        parent_id: str,
        children: int,
        lease_id: str | None = None,
        grant: Grant | None = None,
        check: Check | None = None,
    ) -> Forked:
        """Save the running replica ``parent_id`` and bring up ``children`` replicas from that state.

        ``lease_id``: the parent's lease, checked under its lock (None: the parent must be unleased, e.g.
        from the command line). ``grant(record)`` leases each child to the caller while its lock is held,
        so no one else can lease it first. ``check(parent)`` runs under the parent's lock first. All or nothing:
        if any child fails, the others are retired. Children are exact copies of the parent
        (``osfleet.replicas.forks``: its hostname and machine id, a new VM generation ID); their spares are made
        once all of them run.
        """
        started = time.monotonic()
        saved, identity = self._save(parent_id, lease_id, check)
        saved_s = time.monotonic() - started
        state = saved.state
        self.registry.counters.inc("forks")
        try:
            results = self._children(state, children, grant, identity, saved.stopped_at, saved.slots, parent_id)
        finally:
            self.forks_unpinned(state.directory.name)
        total = time.monotonic() - started
        paused = float(state.meta.get("parent_paused_seconds", 0.0))
        return Forked(parent_id, state.directory.name, state.memory_mode, saved_s, total, results, paused)

    def checkpoint(
        self,
        parent_id: str,
        lease_id: str | None,
        keep: Callable[[SavedState, tuple[str, str], float], None],
        check: Check | None = None,
    ) -> SavedState:
        """Save the running replica ``parent_id`` as a fork no replica uses yet and hand it to ``keep(state,
        identity, stopped_at)`` (which records it under a name) before the fork could be collected; a ``keep`` that
        raises leaves nothing behind."""
        saved, identity = self._save(parent_id, lease_id, check)
        forks = self._forks()
        try:
            forks.release_slots(saved.slots)
            keep(saved.state, identity, saved.stopped_at)
        finally:
            self.forks_unpinned(saved.state.directory.name)
        return saved.state

    def start_from(
        self, state: SavedState, count: int, grant: Grant | None, identity: tuple[str, str], stopped_at: float
    ) -> list[Child]:
        """Bring up ``count`` new replicas from a kept fork (a checkpoint), as a fork's children start; the
        fork is pinned meanwhile, so deleting its name cannot take it away under them."""
        forks = self._forks()
        fork_id = state.directory.name
        forks.pin(fork_id)
        try:
            return self._children(state, count, grant, identity, stopped_at, [], f"checkpoint {fork_id}")
        finally:
            self.forks_unpinned(fork_id)

    def forks_unpinned(self, fork_id: str) -> None:
        """A fork's save or start is over: it may be collected now if nothing keeps it, and the next fork's
        slots are made (once the children run: they would slow them down)."""
        forks = self._forks()
        forks.unpin(fork_id)
        self.collect_forks()
        forks.prepare()

    def _forks(self) -> Forks:
        if self.forks is None:
            raise OsfleetError("forks are not available on this host")
        return self.forks

    def _save(self, parent_id: str, lease_id: str | None, check: Check | None) -> tuple[Saved, tuple[str, str]]:
        """Save the running replica under its lock (its lease checked); the fork is pinned until
        ``forks_unpinned``. Returns the save and the parent's identity (hostname, machine id)."""
        forks = self._forks()
        with self.registry.locked(parent_id) as parent:
            if check is not None:
                check(parent)
            if parent.state not in RUNNING_STATES:
                raise ReplicaBusyError(f"replica {parent_id} is {parent.state}; only a running replica forks")
            held = parent.lease.id if parent.lease is not None else None
            if held != lease_id:
                raise LeaseError(
                    f"lease {lease_id} does not hold replica {parent_id}"
                    if lease_id
                    else f"replica {parent_id} is leased: fork it through its lease holder"
                )
            forks.check_limits(parent, self.registry.all())
            identity = (parent.hostname, parent.machine_id)
            try:
                self.unpark_locked(parent)  # its state is saved running, as any child will run
                saved = forks.save(parent)
            except Exception as exc:
                forks.prepare()  # the slots of a failed fork are gone: make new ones for the next
                raise as_osfleet(exc, f"forking {parent_id}") from exc
            finally:
                self._maybe_park(parent)  # an unleased parent waits parked again, as every ready replica
            if not parent.parked:  # its clock stood still while it was stopped (a parked one is set at its lease)
                self.gen.adjust_clock_later(parent.domain, float(saved.state.meta["parent_paused_seconds"]))
        return saved, identity

    def _children(
        self,
        state: SavedState,
        children: int,
        grant: Grant | None,
        identity: tuple[str, str],
        stopped_at: float,
        ready: list[Slot],
        source: str,
    ) -> list[Child]:
        """Bring up ``children`` replicas from ``state`` (the first on ``ready`` slots), all or nothing; none from a
        state whose image's disk changed since it was saved (``forks.image_changed``)."""
        forks = self._forks()
        refused = image_changed(state, f"fork {state.directory.name}", "reset its replica, then fork it again")
        if refused is not None:
            forks.release_slots(ready)
            raise refused
        slots = ready[:children]
        forks.release_slots(ready[children:])
        made: list[str] = []
        try:
            with ThreadPoolExecutor(max_workers=FORK_WORKERS, thread_name_prefix="osfleet-fork") as pool:
                futures = [
                    pool.submit(
                        self._fork_child,
                        state,
                        grant,
                        made,
                        identity,
                        stopped_at,
                        slots[i] if i < len(slots) else None,
                    )
                    for i in range(children)
                ]
                results = [f.result() for f in futures]
            for r in results:  # every child runs: back to the priority of every other replica
                self.gen.vcpus_at_normal_priority(r.record.domain)
        except Exception as exc:
            taken = set(made)
            forks.release_slots(s for s in slots if s.replica_id not in taken)
            for rid in made:
                with contextlib.suppress(OsfleetError):
                    self.retire(rid)
            raise as_osfleet(exc, f"bringing up the children of {source}") from exc
        for child in results:  # spares (and parking) once every child runs: they would slow the others down
            with contextlib.suppress(ReplicaNotFoundError), self.registry.locked(child.record.id) as rec:
                self.gen.prepare_standby(rec)
                self._maybe_park(rec)
        return results

    def _fork_child(
        self,
        state: SavedState,
        grant: Grant | None,
        made: list[str],
        identity: tuple[str, str],
        stopped_at: float,
        slot: Slot | None,
    ) -> Child:
        rid = self._new_record("snapshot", slot.replica_id if slot else None, identity)
        made.append(rid)
        start = time.monotonic()
        with self.registry.locked(rid) as rec, collecting() as stages:
            try:
                self.gen.bring_up_from(rec, state, slot, stopped_at, vcpu_nice=CHILD_LOADING_NICE)
                rec.move(State.READY)
                lease = grant(rec) if grant is not None else None
                self.registry.save(rec)
            except Exception as exc:
                err = as_osfleet(exc, f"bringing up fork child {rid}")
                self.registry.fail(rec, f"fork bring-up failed: {err}")
                raise err from exc
            took = time.monotonic() - start
            self.registry.counters.inc("fork_children")
            return Child(rec.model_copy(deep=True), lease, took, dict(stages.seconds))

    def collect_forks(self) -> list[str]:
        """Remove saved forks no replica uses any more (a child reset or retired was the last user)."""
        if self.forks is None:
            return []
        return self.forks.collect(self.registry.all())

    # --- resets --------------------------------------------------------------------------------------------
    def reset(
        self, replica_id: str, mode: Mode | None = None, unless_pristine: bool = False, check: Check | None = None
    ) -> Timed:
        """Bring the replica back to its exact initial state (a new generation); keeps its lease.

        ``unless_pristine``: nothing to do when its generation is still as it was made (nothing acted on it
        since): a replica is reset when its lease ends, so the reset at the start of the next lease's first
        task would only redo that one (and wait for the spare the first reset is still making). ``check(rec)``
        runs under the replica's lock first."""
        with self.registry.locked(replica_id) as rec:
            if check is not None:
                check(rec)
            if rec.state not in RUNNING_STATES:
                raise ReplicaBusyError(f"replica {replica_id} is {rec.state}; only ready or leased replicas reset")
            if unless_pristine and (mode is None or mode == rec.mode) and self.pristine(rec):
                return Timed(rec.id, rec.mode, 0.0, rec.generation)
            return self.reset_locked(rec, mode)

    # --- pristine generations: made by a bring-up or reset, nothing acted on them since ------------------------
    def _note_pristine(self, rec: ReplicaRecord) -> None:
        with self._pristine_lock:
            self._pristine.add((rec.id, rec.generation))

    def mark_used(self, replica_id: str, generation: int) -> None:
        """Something is about to act on this generation (an action, a shell command): it is not pristine."""
        with self._pristine_lock:
            self._pristine.discard((replica_id, generation))

    def pristine(self, rec: ReplicaRecord) -> bool:
        """In memory only: after a restart of this process no generation counts as pristine (it is reset)."""
        with self._pristine_lock:
            return (rec.id, rec.generation) in self._pristine

    def reset_locked(self, rec: ReplicaRecord, mode: Mode | None = None, then: State | None = None) -> Timed:
        """Reset ``rec`` while the caller holds its lock. The replica stays ``resetting`` (not leasable) until
        the new generation is ready, then becomes ``then`` (default: leased if it was, else ready)."""
        mode = mode or self.default_mode
        if mode != "snapshot":
            self.gen.drop_standby(rec.id)
        after = then or (State.LEASED if rec.state == State.LEASED else State.READY)
        old_domain, old_disk, old_layers = rec.domain, rec.disk, list(rec.layers)
        start = time.monotonic()
        rec.move(State.RESETTING)
        try:
            # The record names the new generation before it exists (a crash leaves something adoption can
            # clean), unless a restored spare already exists: then adoption finds it as an orphan domain.
            if mode != "snapshot" or not self.gen.spare_ready(rec.id):
                with stage("reset.record"):
                    self.registry.save(rec)
            # The old generation is paused and destroyed in the background, once the new one is ready:
            # tearing QEMU down takes 1-2 s that need not be on the reset's critical path.
            self._bring_up(rec, mode)
            self._note_pristine(rec)
            rec.move(after)
            with stage("reset.record"):
                self.registry.save(rec)
        except Exception as exc:
            err = as_osfleet(exc, f"resetting {rec.id}")
            self.gen.retire_generation(old_domain, Path(old_disk))
            self.registry.fail(rec, f"reset failed: {err}")
            raise err from exc
        self.gen.retire_generation(old_domain, Path(old_disk))
        self.registry.counters.inc("resets")
        if self.forks is not None and any(Path(p).parent.parent == self.forks.root for p in old_layers):
            self.collect_forks()  # a fork's child went back to the initial state
        took = time.monotonic() - start
        self.gen.prepare_standby(rec)
        self._maybe_park(rec)
        return Timed(rec.id, mode, took, rec.generation)

    # --- parking -------------------------------------------------------------------------------------------
    def park_locked(self, rec: ReplicaRecord) -> None:
        """Pause a ready, unleased replica until it is leased: a parked replica uses no CPU (an idle TCG
        desktop costs ~0.5 % of a core, which bounds how many a host holds) and resumes in a few ms. Its
        guest's resident helper (``guest_control``) sets the clock at the lease: nothing is started for it."""
        if rec.parked or rec.state != State.READY or rec.lease is not None:
            return
        self.gen.virt.suspend(rec.domain)
        rec.parked = True
        self.registry.save(rec)

    def unpark_locked(self, rec: ReplicaRecord) -> None:
        """Resume a parked replica and set its clock (it stood still while paused)."""
        if not rec.parked:
            return
        self.gen.virt.resume(rec.domain)
        rec.parked = False
        guest_clock.set_now(self.gen.virt, rec.domain)
        self.registry.save(rec)

    def _maybe_park(self, rec: ReplicaRecord) -> None:
        if not self.park or rec.state != State.READY:
            return
        try:
            self.park_locked(rec)
        except Exception as exc:  # a replica that could not park stays ready and running
            log.warning("replica %s: parking failed: %s", rec.id, as_osfleet(exc, f"parking {rec.id}"))

    # --- failures ------------------------------------------------------------------------------------------
    def detect(self) -> list[str]:
        """Mark replicas whose QEMU is gone as failed; returns the ids of every failed replica due for
        recovery (just detected, failed during a reset, or a failed recovery old enough to retry)."""
        due = []
        records = self.registry.all()
        dead = self.liveness.dead() if self.liveness is not None else set()
        for rec in records:
            if rec.state in RUNNING_STATES and (problem := self._problem(rec, dead)):
                try:
                    with self.registry.locked(rec.id, wait=False) as live:
                        if live.state in RUNNING_STATES and live.domain == rec.domain and self._problem(live, dead):
                            self.registry.fail(live, problem)
                            due.append(live.id)
                except (ReplicaNotFoundError, ReplicaBusyError):
                    continue  # retired meanwhile, or an operation on it is under way (it will see the failure)
            elif rec.state == State.FAILED:
                retrying = (rec.error or "").startswith("recovery failed")
                if not retrying or time.time() - rec.updated_at >= RECOVERY_RETRY_SECONDS:
                    due.append(rec.id)
        if self.liveness is not None:
            self.liveness.probe([r.domain for r in records if r.state in RUNNING_STATES and not r.parked])
        return due

    def _problem(self, rec: ReplicaRecord, dead: set[str]) -> str | None:
        """Why a running replica is not usable any more, or None."""
        if not self.gen.virt.is_running(rec.domain):
            return "the replica's QEMU process is gone"
        if rec.disk and not Path(rec.disk).exists():
            return f"its overlay {rec.disk} was deleted"
        if rec.domain in dead:
            return "its guest agent stopped answering (QEMU frozen or guest hung)"
        return None

    def recover(self, replica_id: str) -> Timed:
        """Rebuild a failed replica: new overlay, new domain, same identity; its lease ends."""
        with self.registry.locked(replica_id) as rec:
            if rec.state != State.FAILED:
                raise ReplicaBusyError(f"replica {replica_id} is {rec.state}, not failed")
            start = time.monotonic()
            rec.move(State.RECOVERING, error=rec.error)
            if rec.lease is not None:
                self.on_lease_lost(
                    rec.lease.id, f"lease {rec.lease.id} ended: replica {replica_id} failed ({rec.error}); lease again"
                )
            rec.lease = None
            mode = rec.mode
            try:
                self.registry.save(rec)
                self.gen.drop_standby(replica_id)
                self.gen.retire_generation(rec.domain, Path(rec.disk))
                self._bring_up(rec, mode)
                self._note_pristine(rec)
                rec.move(State.READY)
                self.registry.save(rec)
            except Exception as exc:
                err = as_osfleet(exc, f"recovering {replica_id}")
                rec.move(State.FAILED, error=f"recovery failed: {err}")
                self.registry.counters.inc("recovery_failures")
                with contextlib.suppress(OsfleetError):  # failed in memory; the next attempt writes it again
                    self.registry.save(rec)
                raise err from exc
            self.registry.counters.inc("recoveries")
            self.collect_forks()
            took = time.monotonic() - start
            self.gen.prepare_standby(rec)
            self._maybe_park(rec)
            return Timed(replica_id, mode, took)

    # --- retirement ----------------------------------------------------------------------------------------
    def retire(self, replica_id: str, check: Check | None = None) -> None:
        """Take the replica down for good; ``check(rec)`` runs under its lock first."""
        with self.registry.locked(replica_id) as rec:
            if check is not None:
                check(rec)
            rec.move(State.RETIRED)
            with contextlib.suppress(OsfleetError):  # the record is deleted below anyway
                self.registry.save(rec)
            self.gen.drop_standby(rec.id)
            self.gen.destroy_all(rec.id)
            shutil.rmtree(self.gen.replica_dir(rec.id), ignore_errors=True)
            self.registry.store.delete(rec.id)
        self.registry.remove(replica_id)
        self.collect_forks()
