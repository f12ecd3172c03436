"""``osfleet bench reset``: cold and snapshot resets on N replicas, side by side in one run.

Between two measured resets the host is allowed to finish its background work (tearing down the old
generation, making the spare), as it would during an agent's episode; the JSON says so.

``snapshot`` uses template memory where this host can (``memory_mode`` says which); ``snapshot_stream``
repeats the snapshot resets with full-stream restores (template memory off) in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil
from PIL import ImageChops

from osfleet.bench.density import process_memory
from osfleet.config import ReplicaShape, Settings
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import distribution, percentile
from osfleet.measure.timing import collecting
from osfleet.protocol.models import MODES, Mode
from osfleet.replicas.input import Input
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

LATENCY_SAMPLES = 20
KEY_SAMPLES = 8
HOLD_MEMORY_RESERVE_BYTES = 2 * 2**30
HOLD_MAX_BRINGUP_SECONDS = 20.0

Say = Callable[[str], None]


def _dist(samples: list[float]) -> dict[str, Any]:
    return {**distribution(samples), "samples": samples}


def _mem_available() -> int:
    return int(psutil.virtual_memory().available)


def _latencies(host: ReplicaHost, rid: str) -> dict[str, Any]:
    """Screenshot, input-event and key-to-screen latency on one ready replica."""
    shots, events, keys = [], [], []
    for _ in range(LATENCY_SAMPLES):
        t = time.perf_counter()
        host.screenshot(rid)
        shots.append(time.perf_counter() - t)
    rec = host.get(rid)
    pointer = Input(host.virt, rec.domain, host.image.screen)
    for i in range(LATENCY_SAMPLES):
        t = time.perf_counter()
        pointer.move(300 + i, 300)
        events.append(time.perf_counter() - t)
    pointer.move(200, 200)  # over the terminal: twm gives it focus
    time.sleep(0.5)
    for _ in range(KEY_SAMPLES):
        before = host.virt.screenshot(rec.domain)
        t = time.perf_counter()
        pointer.type_text("x")
        while time.perf_counter() - t < 5:
            if ImageChops.difference(before, host.virt.screenshot(rec.domain)).getbbox():
                keys.append(time.perf_counter() - t)
                break
        time.sleep(0.2)
    out = {"screenshot_seconds": _dist(shots), "input_event_seconds": _dist(events)}
    if keys:
        out["key_to_screen_seconds"] = _dist(keys)
    return out


def _memory(host: ReplicaHost, rid: str) -> dict[str, int]:
    """RSS and PSS of a replica's QEMU (PSS divides the template pages it maps among their mappers)."""
    pid = host.virt.qemu_pid(host.get(rid).domain)
    return process_memory(pid) if pid is not None else {}


def _spare_memory(host: ReplicaHost, rid: str) -> dict[str, int]:
    """The same for the replica's spare (its next generation, paused)."""
    rec = host.get(rid)
    pid = host.virt.qemu_pid(host.generations.domain_name(rid, rec.generation + 1))
    return process_memory(pid) if pid is not None else {}


def _mode_run(
    host: ReplicaHost,
    mode: Mode,
    replicas: int,
    resets: int,
    say: Say,
    made: list[str],
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Bring up ``replicas`` (their ids go to ``made`` as they are made, for the caller's clean-up), reset
    each ``resets`` times, measure; the replicas are left for the caller.

    With ``budget_s``, no new round of resets starts once the rounds so far took longer (at least one round
    runs): a cold reset is a full boot, minutes on an image whose session starts office applications under
    TCG, and a third round of those adds nothing a ratio needs."""
    made.clear()
    bringup: list[float] = []
    for i in range(replicas):
        t = host.create(mode)
        made.append(t.replica)
        bringup.append(t.seconds)
        say(f"  {mode}: replica {i + 1}/{replicas} ready in {t.seconds:.2f} s")
    host.settle()
    rss = [host.rss_bytes(r) or 0 for r in made]
    mem = [_memory(host, r) for r in made]
    spare = [_spare_memory(host, r) for r in made]
    samples: list[float] = []
    stages: dict[str, list[float]] = {}
    rounds_started = time.monotonic()
    rounds = 0
    for r in range(resets):
        if r and budget_s is not None and time.monotonic() - rounds_started > budget_s:
            say(f"  {mode}: {r} round(s) took more than {budget_s:.0f} s: no more rounds")
            break
        rounds += 1
        for rid in made:
            host.settle()
            with collecting() as st:
                t = host.reset(rid, mode)
            samples.append(t.seconds)
            for name, sec in st.seconds.items():
                stages.setdefault(name, []).append(sec)
        say(f"  {mode}: reset round {r + 1}/{resets}: {', '.join(f'{s:.2f} s' for s in samples[-replicas:])}")
    host.settle()
    result = _dist(samples)
    result["rounds"] = rounds
    result["bringup_seconds"] = _dist(bringup)
    # where a reset's time goes (osfleet.measure.timing stages; ``clock`` overlaps ``screen``)
    result["stages_p50_ms"] = {k: round(percentile(v, 50) * 1000, 2) for k, v in stages.items()}
    result["rss_bytes_per_replica"] = sum(rss) / len(rss)
    result["pss_bytes_per_replica"] = sum(m.get("pss", 0) for m in mem) / len(mem)
    if any(spare):
        result["spare_pss_bytes_per_replica"] = sum(m.get("pss", 0) for m in spare) / len(spare)
    retries = host.counters["bringup_retries"]
    if retries:
        result["bringup_retries"] = retries  # generations that did not come up and were made again
    return result


def _hold(host: ReplicaHost, hold_max: int, say: Say) -> dict[str, Any]:
    """Bring up snapshot replicas until memory (with a reserve) or --hold-max runs out; all must answer."""
    before = _mem_available()
    before_hold = set(host.made_here())
    made: list[str] = []
    times: list[float] = []
    stop_reason = f"reached --hold-max {hold_max}"
    try:
        while len(made) < hold_max:
            if _mem_available() < HOLD_MEMORY_RESERVE_BYTES:
                stop_reason = f"less than {HOLD_MEMORY_RESERVE_BYTES >> 30} GiB of memory left"
                break
            t = host.create("snapshot")
            made.append(t.replica)
            times.append(t.seconds)
            if len(made) % 4 == 0:
                say(f"  hold: {len(made)} replicas ready (last bring-up {t.seconds:.2f} s)")
            if t.seconds > HOLD_MAX_BRINGUP_SECONDS:
                stop_reason = f"bring-up slower than {HOLD_MAX_BRINGUP_SECONDS:.0f} s"
                break
        host.settle()
        time.sleep(5)
        answering = 0
        for rid in made:
            try:
                host.virt.agent(host.get(rid).domain, "guest-ping", timeout=10)
                answering += 1
            except OsfleetError:
                pass
        used = before - _mem_available()
        return {
            "held_ready": answering,
            "made": len(made),
            "stop_reason": stop_reason,
            "host_memory_used_bytes": used,
            "memory_bytes_per_replica": used / max(1, len(made)),
            "bringup_seconds": _dist(times) if times else None,
        }
    finally:
        say(f"  hold: tearing down {len(made)} replicas in parallel")
        host.down([r for r in host.made_here() if r not in before_hold])


def run(
    image: GoldenImage,
    replicas: int,
    resets: int = 3,
    hold: bool = False,
    hold_max: int = 64,
    settings: Settings | None = None,
    say: Say = print,
    compare_stream: bool = True,
    cold_budget_s: float | None = None,
) -> dict[str, Any]:
    if replicas < 1 or resets < 1:
        raise OsfleetError("--replicas and --resets must be at least 1")
    settings = settings or Settings.from_env()
    result: dict[str, Any] = {
        "benchmark": "reset",
        "image": image.name,
        "replicas": replicas,
        "resets_per_replica": resets,
        "cold_budget_s": cold_budget_s,
        "between_resets": "background teardown and the next spare allowed to finish (as during an episode)",
    }
    hosts: list[ReplicaHost] = []
    try:
        host = ReplicaHost(image, settings, ReplicaShape(), mode="snapshot", auto_recover=False, say=say)
        hosts.append(host)
        result["accelerator"] = host.accel
        started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        state = host.saved()
        result.update(memory_mode=state.memory_mode, spares=host.generations.spares)
        made: list[str] = []
        for mode in MODES:
            say(f"{mode} mode: {replicas} replicas, {resets} resets each ({state.memory_mode} memory)")
            budget = cold_budget_s if mode == "cold" else None
            result[mode] = _mode_run(host, mode, replicas, resets, say, made, budget)
            if mode == "snapshot":
                result["latency"] = _latencies(host, made[0])
            host.down(made)
        result["saved_state"] = {
            "memory_mode": state.memory_mode,
            "memory_bytes": state.meta["memory_bytes"],
            "ram_file_bytes": state.meta.get("ram_resident_bytes"),
            "save_seconds": state.meta["save_seconds"],
            "made_in_this_run": state.meta["saved_at"] >= started_at,
            "saved_at": state.meta["saved_at"],
        }
        result["speedup_snapshot_vs_cold"] = result["cold"]["p50"] / result["snapshot"]["p50"]
        if compare_stream and state.memory_mode == "template":
            say(f"snapshot resets with full-stream restores: {replicas} replicas, {resets} resets each")
            stream_host = ReplicaHost(
                image, settings, ReplicaShape(), mode="snapshot", auto_recover=False, say=say, memory="stream"
            )
            hosts.append(stream_host)
            stream_host.saved()
            result["snapshot_stream"] = _mode_run(stream_host, "snapshot", replicas, resets, say, made)
            stream_host.down(made)
        if hold:
            say(f"hold: as many snapshot replicas as fit (at most {hold_max})")
            result["hold"] = _hold(host, hold_max, say)
    except Exception as exc:  # what was measured is still reported, with the failure named (exit code 1)
        result["failure"] = str(as_osfleet(exc, "the reset benchmark"))
        say(f"reset bench failed: {result['failure']}")
    finally:
        for h in hosts:  # every replica this run made, whatever happened (Ctrl-C and SIGTERM included)
            try:
                left = h.down(h.made_here())  # a half-made one an interrupt caught included; never an adopted one
                if left:
                    say(f"  removed {left} replica(s) this run left")
            finally:
                h.close()
    result["machine"] = describe(result.get("accelerator"))
    return result
