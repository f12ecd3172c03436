"""``osfleet bench density``: how many ready desktops this host holds at once, and what each one costs.

Snapshot replicas are brought up one after another until the host's available memory falls to a reserve
(or ``--max``, or a bring-up takes too long); then every one must answer (guest agent ping and a drawn
desktop on its screen), their idle CPU is measured from their QEMU processes' own CPU time, and all are
torn down. Replicas are held without reset spares (a spare costs about as much as a replica; ``bench
reset`` measures them). ``--compare`` repeats the run with template memory off (full-stream restores) in
the same invocation, so both figures come from one machine state.

Ready replicas are parked by default (``--park``, as ``host serve --park`` keeps them): paused until
leased, so an idle TCG desktop's ~1 % of a core (which bounds how many *running* replicas two cores hold,
``--running``) is not spent while nobody uses it. Each one is resumed for its answering check as a lease
resumes it (``resume_p50_s``) and parked again; ``cpu_per_idle_replica`` is still what a running idle
replica costs (measured on a few resumed for the window), ``cpu_per_parked_replica`` what a parked one does.

Memory per replica is the host's view (MemAvailable before the first bring-up minus after the last,
divided by the count: QEMU, libvirt, page cache and all); ``pss_mib_per_replica`` is the replicas' QEMU
processes' proportional set size, which another workload on the host cannot disturb. The template RAM
file on tmpfs exists before the first bring-up and is reported on its own (``template_ram_mib``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import percentile
from osfleet.replicas.manager import ReplicaHost, Timed
from osfleet.replicas.saved_state import SavedState
from osfleet.replicas.template_memory import MemoryMode
from osfleet.vm import screen
from osfleet.vm.host_tune import ksm_status
from osfleet.vm.images import GoldenImage

log = logging.getLogger(__name__)

MEMORY_RESERVE_BYTES = 2 * 2**30
MAX_BRINGUP_SECONDS = 20.0
SLOW_WINDOW = 5  # bring-ups judged together: one slow one (a neighbour's burst) does not end the run
SAMPLE_EVERY = 8  # replicas between two points of the memory curve
SETTLE_SECONDS = 5.0  # after the last bring-up, before answering and CPU are measured
CPU_WINDOW_SECONDS = 10.0
CPU_SAMPLE_RUNNING = 8  # parked runs: replicas resumed to measure what a running idle one costs
KSM_POLL_SECONDS = 5.0
UNLIMITED = 100_000
MAX_FAILURES_IN_A_ROW = 3
ANSWER_ATTEMPTS = 2

Say = Callable[[str], None]


def mem_available() -> int:
    return int(psutil.virtual_memory().available)


def process_memory(pid: int) -> dict[str, int]:
    """RSS, PSS and private bytes of one process (``/proc/PID/smaps_rollup``); empty if it is gone."""
    out: dict[str, int] = {}
    keys = {"Rss:": "rss", "Pss:": "pss", "Private_Clean:": "private", "Private_Dirty:": "private"}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] in keys:
                out[keys[fields[0]]] = out.get(keys[fields[0]], 0) + int(fields[1]) * 1024
    except (OSError, ValueError):
        return {}
    return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_per_replica(pids: list[int], window: float = CPU_WINDOW_SECONDS) -> float | None:
    """Cores used per replica while idle: the QEMU processes' CPU time over ``window``, averaged."""
    before = {p: cpu_seconds(p) for p in pids}
    start = time.monotonic()
    time.sleep(window)
    elapsed = time.monotonic() - start
    used = []
    for p, b in before.items():
        a = cpu_seconds(p)
        if a is not None and b is not None:
            used.append(a - b)
    return sum(used) / elapsed / len(used) if used else None


def wait_for_ksm(timeout: float, say: Say) -> dict[str, Any]:
    """Wait until KSM stops finding new pages to merge (or ``timeout``); its status after."""
    status = ksm_status()
    if timeout <= 0 or not status.get("available") or status.get("run") != 1:
        return status
    deadline = time.monotonic() + timeout
    last = -1
    while time.monotonic() < deadline:
        time.sleep(KSM_POLL_SECONDS)
        status = ksm_status()
        say(f"  KSM: {status['saved_bytes'] >> 20} MiB saved")
        if status["pages_sharing"] == last:
            break
        last = status["pages_sharing"]
    return status


def _answers(host: ReplicaHost, rid: str, resumes: list[float]) -> bool:
    """Guest agent ping and a drawn desktop: the replica is really there. A parked replica is resumed for
    the check as a lease would resume it (clock set; the time goes to ``resumes``) and parked again."""
    with host.registry.locked(rid) as rec:
        parked = rec.parked
        try:
            if parked:
                t = time.monotonic()
                host.lifecycle.unpark_locked(rec)
                resumes.append(time.monotonic() - t)
            for _ in range(ANSWER_ATTEMPTS):  # a host this full is slow: a second chance before "not answering"
                try:
                    host.virt.agent(rec.domain, "guest-ping", timeout=10)
                    shot = host.virt.screenshot(rec.domain)
                    if screen.desktop_drawn(shot, host.image.background, host.image.screen):
                        return True
                except OsfleetError:
                    continue
            return False
        except OsfleetError:
            return False
        finally:
            if parked and not rec.parked:
                try:
                    host.lifecycle.park_locked(rec)
                except OsfleetError as exc:
                    log.warning("density: %s could not park again: %s", rid, exc)


def _running_idle_cpu(host: ReplicaHost, sample: list[str], say: Say) -> float | None:
    """Idle CPU of a running (unparked) replica, what a leased replica that waits for its agent costs:
    measured on a few replicas resumed for the window, then parked again."""
    woken = []
    for rid in sample:
        with host.registry.locked(rid) as rec:
            try:
                host.lifecycle.unpark_locked(rec)
                woken.append(rid)
            except OsfleetError as exc:
                log.warning("density: resuming %s failed: %s", rid, exc)
    time.sleep(SETTLE_SECONDS)
    pids = [p for rid in woken if (p := host.virt.qemu_pid(host.get(rid).domain)) is not None]
    say(f"  measuring idle CPU of {len(pids)} running replicas for {CPU_WINDOW_SECONDS:.0f} s")
    cpu = idle_cpu_per_replica(pids)
    for rid in woken:
        with host.registry.locked(rid) as rec:
            try:
                host.lifecycle.park_locked(rec)
            except OsfleetError as exc:
                log.warning("density: parking %s again failed: %s", rid, exc)
    return cpu


@dataclass
class _Bringups:
    """What the bring-up stage has made and measured so far. It is filled as replicas come, so the tear-down that
    follows an interrupt still names every replica made before it."""

    stop_reason: str
    made: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    curve: list[dict[str, float]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def add(self, ready: Timed, before: int, say: Say) -> None:
        """One more ready replica; every ``SAMPLE_EVERY``-th (and the first) is a point of the memory curve."""
        self.made.append(ready.replica)
        self.times.append(ready.seconds)
        n = len(self.made)
        if n % SAMPLE_EVERY == 0 or n == 1:
            used = before - mem_available()
            self.curve.append({"replicas": n, "mib_per_replica": used / n / 2**20})
            say(f"  {n} ready (last bring-up {ready.seconds:.2f} s, {used / n / 2**20:.0f} MiB each so far)")

    def too_slow(self) -> bool:
        """The p50 of the last ``SLOW_WINDOW`` bring-ups, not one of them: a neighbour's burst does not end the run."""
        recent = self.times[-SLOW_WINDOW:]
        return len(recent) == SLOW_WINDOW and percentile(recent, 50) > MAX_BRINGUP_SECONDS

    def close_curve(self, used: int) -> None:
        """The curve ends on the count held, whatever the sampling step."""
        n = len(self.made)
        if n and (not self.curve or self.curve[-1]["replicas"] != n):
            self.curve.append({"replicas": n, "mib_per_replica": used / n / 2**20})


@dataclass(frozen=True)
class _IdleCost:
    """What held replicas cost while nobody uses them: cores each, running and parked, and their QEMU PSS."""

    cpu: float | None
    cpu_parked: float | None
    pss: list[int]


@dataclass(frozen=True)
class _Answers:
    """The answering check's counts, and the resume times it measured on the way (a parked replica is resumed as a
    lease would resume it)."""

    answering: int
    parked_at_end: int
    resumes: list[float]


def hold(
    image: GoldenImage,
    settings: Settings,
    memory: MemoryMode | None,
    max_replicas: int | None,
    say: Say,
    ksm_wait: float = 0.0,
    reserve: int = MEMORY_RESERVE_BYTES,
    park: bool = True,
    shape: ReplicaShape | None = None,
) -> dict[str, Any]:
    """Bring up snapshot replicas until memory runs out (or ``max_replicas``), check them, tear them down.
    ``park``: ready replicas wait paused until leased, as ``host serve --park`` keeps them."""
    limit = max_replicas or UNLIMITED
    host = _density_host(image, settings, shape or ReplicaShape(), memory, limit, park, say)
    run = _Bringups(stop_reason=f"reached --max {limit}")
    try:
        state = host.saved()  # made once, before anything is measured
        say(
            f"density, template memory {'on' if _sharing(state) else 'off'}, ready replicas "
            f"{'parked' if park else 'running'}: up to {limit if max_replicas else 'memory'}"
        )
        before = mem_available()
        _bring_up_until_full(host, run, limit, reserve, before, say)
        ksm = _settle(host, ksm_wait, say)
        used = before - mem_available()
        run.close_curve(used)
        idle = _idle_cost(host, run.made, park, say)
        answers = _check_answers(host, run.made, say)
        return _result(state, park, run, used, idle, answers, ksm)
    finally:
        _tear_down(host, run.made, say)


def _density_host(
    image: GoldenImage,
    settings: Settings,
    shape: ReplicaShape,
    memory: MemoryMode | None,
    limit: int,
    park: bool,
    say: Say,
) -> ReplicaHost:
    """Snapshot replicas without reset spares: a spare costs about as much as a replica (``bench reset`` measures
    them), so the count would halve."""
    return ReplicaHost(
        image,
        settings,
        shape,
        mode="snapshot",
        auto_recover=False,
        say=say,
        max_replicas=limit,
        memory=memory,
        spares=False,
        park=park,
    )


def _sharing(state: SavedState) -> bool:
    return state.memory_mode == "template"


def _bring_up_until_full(host: ReplicaHost, run: _Bringups, limit: int, reserve: int, before: int, say: Say) -> None:
    """One replica after another until ``limit``, the memory reserve, too many failures in a row or slow bring-ups
    stop it; ``run.stop_reason`` says which."""
    failures_in_a_row = 0
    while len(run.made) < limit:
        if mem_available() < reserve:
            run.stop_reason = f"less than {reserve >> 20} MiB of memory left (the reserve)"
            return
        existing = {r.id for r in host.replicas()}
        try:
            ready = host.create("snapshot")
            failures_in_a_row = 0
        except OsfleetError as exc:  # counted; the failed replica is retired, the run goes on
            run.failed.append(str(exc))
            say(f"  bring-up failed: {exc}")
            _retire_new(host, existing)
            failures_in_a_row += 1
            if failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
                run.stop_reason = f"{failures_in_a_row} bring-ups in a row failed, last: {exc}"
                return
            continue
        run.add(ready, before, say)
        if run.too_slow():
            run.stop_reason = f"bring-up p50 of the last {SLOW_WINDOW} slower than {MAX_BRINGUP_SECONDS:.0f} s"
            return


def _retire_new(host: ReplicaHost, existing: set[str]) -> None:
    """Retire what a failed bring-up left: the replica it made, nobody else's."""
    for rec in host.replicas():
        if rec.id not in existing:
            host.retire(rec.id)


def _settle(host: ReplicaHost, ksm_wait: float, say: Say) -> dict[str, Any]:
    """Let the last bring-ups' work die down (and KSM merge, if asked) before memory and CPU are read."""
    host.settle()
    time.sleep(SETTLE_SECONDS)
    return wait_for_ksm(ksm_wait, say)


def _idle_cost(host: ReplicaHost, made: list[str], park: bool, say: Say) -> _IdleCost:
    """Parked replicas are measured as they are held, then a few resumed for what a running idle one costs."""
    pids = [p for rid in made if (p := host.virt.qemu_pid(host.get(rid).domain)) is not None]
    cpu_parked = None
    if park:
        say(f"  measuring the CPU of {len(pids)} parked replicas for {CPU_WINDOW_SECONDS:.0f} s")
        cpu_parked = idle_cpu_per_replica(pids)
        cpu = _running_idle_cpu(host, made[:CPU_SAMPLE_RUNNING], say)
    else:
        say(f"  measuring idle CPU of {len(pids)} replicas for {CPU_WINDOW_SECONDS:.0f} s")
        cpu = idle_cpu_per_replica(pids)
    pss = [process_memory(p).get("pss", 0) for p in pids]
    return _IdleCost(cpu, cpu_parked, pss)


def _check_answers(host: ReplicaHost, made: list[str], say: Say) -> _Answers:
    """A replica counts as held only if it answers; the check must leave the parked ones parked."""
    say(f"  checking that each of {len(made)} replicas answers (guest agent + drawn desktop)")
    resumes: list[float] = []
    answering = sum(1 for rid in made if _answers(host, rid, resumes))
    parked = sum(1 for rid in made if host.get(rid).parked)
    return _Answers(answering, parked, resumes)


def _result(
    state: SavedState,
    park: bool,
    run: _Bringups,
    used: int,
    idle: _IdleCost,
    answers: _Answers,
    ksm: dict[str, Any],
) -> dict[str, Any]:
    """One mode's part of ``density.json``; the keys keep the order earlier results were written in."""
    n, pss, resumes, times = len(run.made), idle.pss, answers.resumes, run.times
    return {
        "template_sharing": _sharing(state),
        "memory_mode": state.memory_mode,
        "spares": False,
        "parked": park,
        "parked_at_end": answers.parked_at_end,
        "resume_p50_s": percentile(resumes, 50) if resumes else None,
        "resume_p95_s": percentile(resumes, 95) if resumes else None,
        "held_ready": n,
        "answering": answers.answering,
        "stop_reason": run.stop_reason,
        "failed_bringups": len(run.failed),
        "mib_per_replica": used / n / 2**20 if n else None,
        "pss_mib_per_replica": sum(pss) / len(pss) / 2**20 if pss else None,
        "host_memory_used_mib": used / 2**20,
        "template_ram_mib": (state.ram.stat().st_blocks * 512) / 2**20 if state.ram else 0,
        "cpu_per_idle_replica": idle.cpu,
        "cpu_per_parked_replica": idle.cpu_parked,
        "bringup_p50_s": percentile(times, 50) if times else None,
        "bringup_p95_s": percentile(times, 95) if times else None,
        "memory_curve": run.curve,
        "ksm": ksm,
    }


def _tear_down(host: ReplicaHost, made: list[str], say: Say) -> None:
    """Every replica this host object made goes, one an interrupt caught halfway included, and the host is closed
    even if a removal fails."""
    if made:
        say(f"  tearing down {len(made)} replicas")
    try:
        host.down(host.made_here())
    finally:
        host.close()


def run(
    image: GoldenImage,
    max_replicas: int | None = None,
    compare: bool = False,
    ksm_wait: float = 0.0,
    settings: Settings | None = None,
    say: Say = print,
    park: bool = True,
    kernel_args: str | None = None,
) -> dict[str, Any]:
    """One density run (template memory where this host can); ``compare`` adds one with it off.
    ``kernel_args``: the guests' extra kernel arguments instead of osfleet's (``ReplicaShape``), e.g. ""
    to measure what they save. A failure part-way still returns what was measured, with ``failure``."""
    if max_replicas is not None and max_replicas < 1:
        raise OsfleetError("--max must be at least 1")
    settings = settings or Settings.from_env()
    shape = ReplicaShape() if kernel_args is None else ReplicaShape(kernel_args=kernel_args)
    result: dict[str, Any] = {
        "benchmark": "density",
        "image": image.name,
        "reserve_mib": MEMORY_RESERVE_BYTES >> 20,
        "kernel_args": shape.kernel_args,
        "available_mib_at_start": mem_available() >> 20,
        "tmpfs_used_by_others_mib": _shm_used_mib(settings),
    }
    try:
        result.update(hold(image, settings, None, max_replicas, say, ksm_wait, park=park, shape=shape))
        if compare:
            say("the same with template memory off (full-stream restores)")
            result["sharing_off"] = hold(image, settings, "stream", max_replicas, say, ksm_wait, park=park, shape=shape)
    except Exception as exc:  # hold() removed its replicas; what was measured is reported with the failure
        result["failure"] = str(as_osfleet(exc, "the density benchmark"))
        say(f"density bench failed: {result['failure']}")
    result["machine"] = describe()
    return result


def _shm_used_mib(settings: Settings) -> int:
    """Memory that tmpfs files of others (other homes' saved states and forks) take from this run."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return int((st.f_blocks - st.f_bfree) * st.f_frsize) >> 20
