"""A replica's life: bring-up, resets, failure detection, recovery and retirement.

Each operation takes the replica's lock for its whole length, and whatever goes wrong in it (libvirt, a
full disk, a bug) ends with the replica marked failed, never stuck in ``resetting`` or ``recovering``:
the monitor then rebuilds it.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from osfleet.config import Mode
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.replicas.errors import ReplicaBusyError, ReplicaNotFoundError
from osfleet.replicas.generations import Generations
from osfleet.replicas.liveness import Liveness
from osfleet.replicas.records import RUNNING_STATES, ReplicaRecord, State
from osfleet.replicas.registry import Registry

# A replica whose recovery failed is tried again after this long (a failing host is not hammered).
RECOVERY_RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class Timed:
    """How long a bring-up or reset took until the replica was ready, and in which mode."""

    replica: str
    mode: Mode
    seconds: float


class Lifecycle:
    """Bring-up, reset, recovery and retirement of the replicas in ``registry``."""

    def __init__(
        self,
        registry: Registry,
        generations: Generations,
        default_mode: Mode,
        liveness: Liveness | None = None,
        on_lease_lost: Callable[[str, str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.gen = generations
        self.default_mode: Mode = default_mode
        self.liveness = liveness
        self.on_lease_lost = on_lease_lost or (lambda _lease, _why: None)

    # --- bring-up ------------------------------------------------------------------------------------------
    def create(self, mode: Mode | None = None) -> Timed:
        """Provision one replica and bring it to ready; returns how long that took."""
        mode = mode or self.default_mode
        if mode == "snapshot":
            self.gen.saved()  # made once; not part of any replica's bring-up time
        rid = f"r-{uuid.uuid4().hex[:8]}"
        now = time.time()
        record = ReplicaRecord(
            id=rid,
            image=self.gen.image.name,
            mode=mode,
            created_at=now,
            updated_at=now,
            hostname=f"osfleet-{rid[2:]}",
            machine_id=uuid.uuid4().hex,
        )
        try:
            directory = self.gen.replica_dir(rid)
            directory.mkdir(parents=True)
            directory.chmod(0o755)
        except OSError as exc:
            raise as_osfleet(exc, f"creating replica {rid}") from exc
        try:
            self.registry.save(record)
        except OsfleetError:
            shutil.rmtree(self.gen.replica_dir(rid), ignore_errors=True)
            raise
        self.registry.add(record)
        start = time.monotonic()
        with self.registry.locked(rid) as rec:
            try:
                self.gen.bring_up(rec, mode)
                rec.move(State.READY)
                self.registry.save(rec)
            except Exception as exc:
                err = as_osfleet(exc, f"bringing up {rid}")
                self.registry.fail(rec, f"bring-up failed: {err}")
                raise err from exc
            took = time.monotonic() - start
            self.gen.prepare_standby(rec)
        return Timed(rid, mode, took)

    # --- resets --------------------------------------------------------------------------------------------
    def reset(self, replica_id: str, mode: Mode | None = None) -> Timed:
        """Bring the replica back to its exact initial state (a new generation); keeps its lease."""
        with self.registry.locked(replica_id) as rec:
            if rec.state not in RUNNING_STATES:
                raise ReplicaBusyError(f"replica {replica_id} is {rec.state}; only ready or leased replicas reset")
            return self.reset_locked(rec, mode)

    def reset_locked(self, rec: ReplicaRecord, mode: Mode | None = None, then: State | None = None) -> Timed:
        """Reset ``rec`` while the caller holds its lock. The replica stays ``resetting`` (not leasable) until
        the new generation is ready, then becomes ``then`` (default: leased if it was, else ready)."""
        mode = mode or self.default_mode
        if mode != "snapshot":
            self.gen.drop_standby(rec.id)
        after = then or (State.LEASED if rec.state == State.LEASED else State.READY)
        old_domain, old_disk = rec.domain, rec.disk
        start = time.monotonic()
        rec.move(State.RESETTING)
        try:
            self.registry.save(rec)
            # Pause the old generation now (it stops competing for CPU); it is destroyed once the new one
            # is ready: tearing QEMU down takes 1-2 s that need not be on the reset's critical path.
            with contextlib.suppress(OsfleetError):  # already gone: the new generation replaces it anyway
                self.gen.virt.suspend(old_domain)
            self.gen.bring_up(rec, mode)
            rec.move(after)
            self.registry.save(rec)
        except Exception as exc:
            err = as_osfleet(exc, f"resetting {rec.id}")
            self.gen.retire_generation(old_domain, Path(old_disk))
            self.registry.fail(rec, f"reset failed: {err}")
            raise err from exc
        self.gen.retire_generation(old_domain, Path(old_disk))
        self.registry.counters.inc("resets")
        took = time.monotonic() - start
        self.gen.prepare_standby(rec)
        return Timed(rec.id, mode, took)

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
            self.liveness.probe([r.domain for r in records if r.state in RUNNING_STATES])
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
                self.gen.bring_up(rec, mode)
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
            took = time.monotonic() - start
            self.gen.prepare_standby(rec)
            return Timed(replica_id, mode, took)

    # --- retirement ----------------------------------------------------------------------------------------
    def retire(self, replica_id: str) -> None:
        with self.registry.locked(replica_id) as rec:
            rec.move(State.RETIRED)
            with contextlib.suppress(OsfleetError):  # the record is deleted below anyway
                self.registry.save(rec)
            self.gen.drop_standby(rec.id)
            self.gen.destroy_all(rec.id)
            shutil.rmtree(self.gen.replica_dir(rec.id), ignore_errors=True)
            self.registry.store.delete(rec.id)
        self.registry.remove(replica_id)
