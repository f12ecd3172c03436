"""A chaos plan (which fault, where, when, for how long) and the runner that plays it against a running fleet.

The runner injects each fault at its time, heals the healable ones after their duration, writes every
fault as one JSON line (``faults.jsonl`` in the run directory: kind, target, injected_at, healed_at, ...)
and, when stopped early, heals whatever is still active before it returns::

    plan = ChaosPlan.load(Path("chaos.yaml"))          # or ChaosPlan.spread(hosts, every_s=20)
    runner = ChaosRunner(plan, lab_hosts(), say=print, run_dir=run_dir)
    faults = runner.run_until(stop_event)               # list[Fault]; runner.failures: injections refused
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from osfleet.chaos import faults as F
from osfleet.chaos.hosts import ChaosHost
from osfleet.errors import ConfigError, OsfleetError, first_problem
from osfleet.replicas.records import RUNNING_STATES, State

Say = Callable[[str], None]
FAULTS_FILE = "faults.jsonl"
# Which replica a replica fault hits when the plan names none: any running one, or one in that state.
Pick = Literal["any", "leased", "ready"]
PICKS = ("any", "leased", "ready")


class FaultSpec(BaseModel):
    """One line of a plan: ``at`` seconds after the start, inject ``kind`` into ``host`` (a replica of it)."""

    model_config = ConfigDict(extra="forbid")

    at: float = Field(ge=0)
    kind: F.Kind
    host: str | None = None  # None: a host chosen by the runner's seeded random generator
    replica: str = "any"  # a replica id, or any | leased | ready (chosen when the fault is injected)
    seconds: float | None = Field(default=None, gt=0)  # heal after this long (healable kinds); None: 10 s
    delay_ms: int = Field(default=200, gt=0)  # delay_link
    floor_mib: int = Field(default=F.DEFAULT_FLOOR_BYTES // 2**20, ge=0)  # fill_image_store
    max_mib: int | None = Field(default=None, gt=0)  # fill_image_store: upper bound of the filler
    dir: str | None = None  # fill_image_store: fill this folder's file system instead of the host's store
    pid: int | None = None  # kill_host_agent: this pid instead of the records' owner


DEFAULT_HEAL_S = 10.0


class ChaosPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    faults: list[FaultSpec]

    @classmethod
    def load(cls, path: Path) -> ChaosPlan:
        """A plan from YAML or JSON: ``faults: [{at: 10, kind: kill_qemu, host: lab1, replica: leased}, ...]``."""
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read chaos plan {path}: {str(exc).splitlines()[0]}") from None
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            raise ConfigError(f"chaos plan {path}: {first_problem(exc, 'plan')}") from None

    @classmethod
    def spread(
        cls,
        hosts: Sequence[ChaosHost],
        kinds: Sequence[str] = ("kill_qemu", "freeze_qemu", "delete_overlay", "fill_image_store", "kill_host_agent"),
        start_s: float = 10.0,
        every_s: float = 20.0,
        seconds: float = 10.0,
        **extra: Any,
    ) -> ChaosPlan:
        """One fault of each kind, ``every_s`` apart, round-robin over the hosts, on leased replicas."""
        if not hosts:
            raise ConfigError("a chaos plan needs at least one host")
        specs = [
            FaultSpec(
                at=start_s + i * every_s,
                kind=kind,  # type: ignore[arg-type]  # checked by pydantic
                host=hosts[i % len(hosts)].name,
                replica="leased",
                seconds=seconds,
                **extra,
            )
            for i, kind in enumerate(kinds)
        ]
        return cls(faults=specs)


@dataclass(frozen=True)
class Failure:
    """A fault that could not be injected, and why (one line)."""

    spec: FaultSpec
    at: float
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.spec.kind, "host": self.spec.host, "replica": self.spec.replica, "at": self.at,
                "error": self.error}  # fmt: skip


def inject(
    spec: FaultSpec, host: ChaosHost, rng: random.Random | None = None, pid_of: F.QemuPidOf = F.libvirt_qemu_pid
) -> F.Fault:
    """Inject one planned fault into ``host`` (choosing its replica when the plan names a state)."""
    kind = spec.kind
    if kind in F.REPLICA_KINDS:
        replica = pick_replica(host, spec.replica, rng or random.Random(), pid_of)
        if kind == "kill_qemu":
            return F.kill_qemu(host, replica, pid_of)
        if kind == "freeze_qemu":
            return F.freeze_qemu(host, replica, pid_of)
        return F.delete_overlay(host, replica, pid_of)
    if kind == "kill_host_agent":
        return F.kill_host_agent(host, spec.pid)
    if kind == "fill_image_store":
        max_bytes = spec.max_mib * 2**20 if spec.max_mib else None
        return F.fill_image_store(
            host,
            floor_bytes=spec.floor_mib * 2**20,
            max_bytes=max_bytes,
            directory=Path(spec.dir) if spec.dir else None,
        )
    if kind == "cut_link":
        return F.cut_link(host)
    return F.delay_link(host, spec.delay_ms)


def pick_replica(host: ChaosHost, wanted: str, rng: random.Random, pid_of: F.QemuPidOf = F.libvirt_qemu_pid) -> str:
    """``wanted`` itself when it is a replica id, else a random replica of ``host`` in that state whose QEMU runs."""
    if wanted not in PICKS:
        return wanted
    states = RUNNING_STATES if wanted == "any" else {State(wanted)}
    candidates = [r.id for r in F.replica_records(host) if r.state in states and r.domain]
    rng.shuffle(candidates)
    for rid in candidates:
        try:
            pid_of(host, F.replica_record(host, rid))
            return rid
        except OsfleetError:
            continue
    raise F.FaultError(f"no {'running' if wanted == 'any' else wanted} replica with a live QEMU on {host.name}")


class ChaosRunner:
    """Plays a ``ChaosPlan`` against ``hosts``; one runner per run, not reusable."""

    def __init__(
        self,
        plan: ChaosPlan,
        hosts: Sequence[ChaosHost],
        say: Say = lambda _m: None,
        run_dir: Path | None = None,
        seed: int = 0,
        active: F.ActiveFaults | None = None,
        pid_of: F.QemuPidOf = F.libvirt_qemu_pid,
    ) -> None:
        self.plan = sorted(plan.faults, key=lambda s: s.at)
        self.hosts = {h.name: h for h in hosts}
        unknown = sorted({s.host for s in self.plan if s.host and s.host not in self.hosts})
        if unknown:
            raise ConfigError(f"chaos plan names unknown host(s) {', '.join(unknown)} (have {', '.join(self.hosts)})")
        if not self.hosts:
            raise ConfigError("chaos runner needs at least one host")
        self.say = say
        self.run_dir = run_dir
        self.rng = random.Random(seed)
        self.active_store = active
        self.pid_of = pid_of
        self.faults: list[F.Fault] = []
        self.failures: list[Failure] = []
        self._lock = threading.Lock()

    def run_until(self, stop: threading.Event) -> list[F.Fault]:
        """Inject every planned fault at its time (relative to now) and heal each after its duration; return
        when all are done or ``stop`` is set, healing whatever is still active first. Returns every fault
        injected, healed ones with ``healed_at``."""
        start = time.monotonic()
        pending = list(self.plan)
        active: list[tuple[float, F.Fault]] = []  # (heal at, fault)
        try:
            while not stop.is_set() and (pending or active):
                now = time.monotonic() - start
                while pending and pending[0].at <= now:
                    self._inject(pending.pop(0), active, now)
                for due, fault in [a for a in active if a[0] <= now]:
                    active.remove((due, fault))
                    self._heal(fault)
                nxt = min([p.at for p in pending[:1]] + [a[0] for a in active], default=now)
                stop.wait(max(0.0, min(nxt - (time.monotonic() - start), 0.5)))
        finally:
            for _due, fault in active:
                self._heal(fault)
        return list(self.faults)

    def _inject(self, spec: FaultSpec, active: list[tuple[float, F.Fault]], now: float) -> None:
        host = self.hosts[spec.host] if spec.host else self.rng.choice(list(self.hosts.values()))
        try:
            fault = inject(spec, host, self.rng, self.pid_of)
        except OsfleetError as exc:
            failure = Failure(spec=spec.model_copy(update={"host": host.name}), at=time.time(), error=str(exc))
            self.failures.append(failure)
            self.say(f"chaos: {spec.kind} on {host.name} not injected: {exc}")
            self._write({"event": "failed", **failure.to_json()})
            return
        self.say(f"chaos: {fault.id} {fault.kind} {fault.target}: {fault.did}")
        if fault.self_healing:
            self._record(fault)
            return
        if self.active_store is not None:
            self.active_store.save(fault)
        with self._lock:
            self.faults.append(fault)
        active.append((now + (spec.seconds or DEFAULT_HEAL_S), fault))

    def _heal(self, fault: F.Fault) -> None:
        try:
            healed = F.heal(fault)
        except OsfleetError as exc:
            self.say(f"chaos: {fault.id} {fault.kind} {fault.target}: heal failed: {exc}")
            healed = fault.model_copy(update={"healed": f"heal failed: {exc}"})
        else:
            self.say(f"chaos: {fault.id} healed: {healed.healed}")
            if self.active_store is not None:
                self.active_store.remove(fault.id)
        with self._lock:
            self.faults = [healed if f.id == fault.id else f for f in self.faults]
        self._write({"event": "fault", **json.loads(healed.line())})

    def _record(self, fault: F.Fault) -> None:
        with self._lock:
            self.faults.append(fault)
        self._write({"event": "fault", **json.loads(fault.line())})

    def _write(self, doc: dict[str, Any]) -> None:
        if self.run_dir is None:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.run_dir / FAULTS_FILE, "a") as f:
            f.write(json.dumps(doc) + "\n")
