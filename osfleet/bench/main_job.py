"""The main job, the mission end to end: golden image -> one replica booted and screenshotted -> disk bench ->
reset bench (one host) -> density bench (ready desktops held at once, the memory curve) -> two lab hosts deployed
with the plain ``pulumi up --stack lab`` (osfleet's language host) -> a fleet gateway over them -> Locust
bring-up and trajectories through the gateway -> ``pulumi destroy`` and ``lab down`` -> report (with the cost
of an active and a parked replica-day and of 1,000 steps), all in one run directory.

Ctrl-C or SIGTERM at any point unwinds the same way (context managers all the way down): Locust stops, the
gateway stops, the stack is destroyed, the lab goes, and ``infra.json`` records what was left.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osfleet.bench import disk as disk_bench
from osfleet.bench.tables import disk_table
from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.measure.host_facts import describe
from osfleet.vm.images import GoldenImage, load

if TYPE_CHECKING:
    from osfleet.bench.lab_fleet import LabFleet

TOTAL = 9
LAB_HOSTS = 2
# Desktops the density stage holds: enough for a curve and a parked replica's memory, in about a minute under
# TCG (``osfleet bench density --max 1000`` is the full measurement).
DENSITY_REPLICAS = 16
READY_SECONDS = 600.0
ROOM_SECONDS = 180.0


_STARTED = [time.monotonic()]


def _stage(n: int, title: str) -> float:
    elapsed = time.monotonic() - _STARTED[0]
    print(f"\n== [{n}/{TOTAL}] {title}  (at {elapsed // 60:.0f} min {elapsed % 60:02.0f} s)", flush=True)
    return time.monotonic()


def _say(message: str) -> None:
    print(message, flush=True)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so everything the job made is taken down either way."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(
    runs_dir: Path,
    replicas: int,
    reset_replicas: int = 2,
    resets: int = 1,
    bringup_replicas: int = 4,
    users: int = 2,
    duration: str = "90s",
    policy: str = "oracle",
) -> Path:
    with sigterm_as_interrupt():
        return _run(runs_dir, replicas, reset_replicas, resets, bringup_replicas, users, duration, policy)


def _run(
    runs_dir: Path,
    replicas: int,
    reset_replicas: int,
    resets: int,
    bringup_replicas: int,
    users: int,
    duration: str,
    policy: str,
) -> Path:
    from fabric import Config  # noqa: F401  (Fabric is a hard dependency of the build)

    settings = Settings.from_env()
    started = _STARTED[0] = time.monotonic()
    run_dir = runs_dir / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir.mkdir(parents=True)
    print(f"osfleet main job; results in {run_dir}", flush=True)
    timings: dict[str, float] = {}
    image = _golden_image(settings, timings)
    machine = _boot(image, run_dir, settings, timings)
    _disk_bench(image, replicas, machine, run_dir, settings, timings)
    _reset_bench(image, reset_replicas, resets, run_dir, settings, timings)
    _density_bench(image, run_dir, settings, timings)
    _on_lab_fleet(run_dir, settings, bringup_replicas, users, duration, policy, timings)
    _report(run_dir, image, machine, timings, started)
    return run_dir


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _golden_image(settings: Settings, timings: dict[str, float]) -> GoldenImage:
    from invoke import Context

    from osfleet.imaging import builder
    from osfleet.imaging.host import Host

    t = _stage(1, "golden image (built once, then a cache hit)")
    files = builder.build(Host(Context()), builder.DEFAULT_RECIPE, str(settings.build_dir))
    image = load(Path(files.manifest))
    timings["image_seconds"] = time.monotonic() - t
    return image


def _boot(image: GoldenImage, run_dir: Path, settings: Settings, timings: dict[str, float]) -> dict[str, Any]:
    """One replica booted to a drawn desktop before anything is measured at scale; the machine it names (with the
    accelerator the boot used) goes with every result of the run."""
    from osfleet.imaging.verify import verify_image

    t = _stage(2, "boot one replica to a drawn desktop and save its screenshot")
    boot = verify_image(image, run_dir / "screenshot.png", settings)
    machine = describe(boot.accel)
    boot_doc: dict[str, Any] = {
        "benchmark": "boot",
        "image": image.name,
        "accelerator": boot.accel,
        "agent_seconds": boot.agent_seconds,
        "desktop_seconds": boot.desktop_seconds,
        "overlay_allocated_bytes_after_boot": boot.overlay_allocated_bytes,
        "screenshot": "screenshot.png",
        "machine": machine,
    }
    _write_json(run_dir / "boot.json", boot_doc)
    print(
        f"guest agent after {boot.agent_seconds:.1f} s, desktop drawn after {boot.desktop_seconds:.1f} s",
        flush=True,
    )
    timings["boot_seconds"] = time.monotonic() - t
    return machine


def _disk_bench(
    image: GoldenImage,
    replicas: int,
    machine: dict[str, Any],
    run_dir: Path,
    settings: Settings,
    timings: dict[str, float],
) -> None:
    t = _stage(3, f"disk bench: {replicas} replicas by overlay, reflink and full copy")
    result = disk_bench.run(image, replicas, settings)
    result["machine"] = machine
    _write_json(run_dir / "disk.json", result)
    print(disk_table(result), flush=True)
    timings["disk_bench_seconds"] = time.monotonic() - t


def _reset_bench(
    image: GoldenImage, reset_replicas: int, resets: int, run_dir: Path, settings: Settings, timings: dict[str, float]
) -> None:
    """A reset bench that failed part-way stops the job: its JSON is written first, so what it measured stays."""
    from osfleet.bench import reset as reset_bench
    from osfleet.bench.tables import reset_table

    t = _stage(4, f"reset bench: {reset_replicas} replicas, {resets} cold and {resets} snapshot resets each")
    resets_doc = reset_bench.run(image, reset_replicas, resets, settings=settings)
    _write_json(run_dir / "reset.json", resets_doc)
    if resets_doc.get("failure"):
        raise OsfleetError(f"reset bench: {resets_doc['failure']}")
    print(reset_table(resets_doc), flush=True)
    timings["reset_bench_seconds"] = time.monotonic() - t


def _density_bench(image: GoldenImage, run_dir: Path, settings: Settings, timings: dict[str, float]) -> None:
    """A few ready desktops held parked, each answering: the density curve and a parked replica's footprint for
    the report's cost. Like the reset bench, a failure stops the job once its JSON is written."""
    from osfleet.bench import density
    from osfleet.bench.tables import density_table

    t = _stage(5, f"density bench: {DENSITY_REPLICAS} ready desktops held parked, the memory curve")
    result = density.run(image, DENSITY_REPLICAS, settings=settings, say=_say)
    _write_json(run_dir / "density.json", result)
    if result.get("failure"):
        raise OsfleetError(f"density bench: {result['failure']}")
    print(density_table(result), flush=True)
    timings["density_bench_seconds"] = time.monotonic() - t


def _on_lab_fleet(
    run_dir: Path,
    settings: Settings,
    bringup_replicas: int,
    users: int,
    duration: str,
    policy: str,
    timings: dict[str, float],
) -> None:
    """Stages 6 to 8 run inside the fleet's ``with``: whichever of them fails or is interrupted, the gateway
    stops, the stack is destroyed, the lab goes, and ``infra.json`` records what was left."""
    from osfleet.bench.lab_fleet import LabFleet

    warm = max(1, -(-users // LAB_HOSTS))  # enough ready replicas across the hosts for every Locust agent
    t = _stage(6, f"{LAB_HOSTS} lab hosts, pulumi up --stack lab (plain CLI, {warm} warm per agent), fleet gateway")
    fleet = LabFleet(run_dir, LAB_HOSTS, warm, settings, _say)
    try:
        with fleet:
            timings["deploy_seconds"] = time.monotonic() - t
            print(_overhead_line(fleet.result["gateway_overhead"]), flush=True)
            _bringup(fleet, run_dir, bringup_replicas, timings)
            _trajectories(fleet, run_dir, users, warm, duration, policy, timings)
            print("taking the fleet down: gateway, pulumi destroy, lab down", flush=True)
            t = time.monotonic()
    finally:
        _write_json(run_dir / "infra.json", fleet.result)
    timings["teardown_seconds"] = time.monotonic() - t
    print(_infra_line(fleet.result), flush=True)


def _bringup(fleet: LabFleet, run_dir: Path, bringup_replicas: int, timings: dict[str, float]) -> None:
    """Asks only for the room the fleet has now (hosts just done booting lack idle CPU for a while): a request
    beyond it is refused, and the stage would measure the refusal instead of a bring-up."""
    from osfleet.bench.load import run_locust

    t = _stage(7, f"Locust bring-up of {bringup_replicas} replicas at once through the gateway")
    asked = fleet.wait_room(bringup_replicas, ROOM_SECONDS)
    if asked < bringup_replicas:
        print(f"the fleet has room for {asked} more replica(s) now (its hosts' CPU): asking for that", flush=True)
    gw = fleet.gateway
    run_locust("bringup", gw.url, gw.token, run_dir, 1, "15m", ["--replicas", str(max(asked, 1))])
    timings["bringup_seconds"] = time.monotonic() - t
    print(_bringup_line(run_dir), flush=True)


def _trajectories(
    fleet: LabFleet,
    run_dir: Path,
    users: int,
    warm: int,
    duration: str,
    policy: str,
    timings: dict[str, float],
) -> None:
    """Locust starts once the hosts' warm pools hold a ready replica per agent: a lease needs one."""
    from osfleet.bench.load import run_locust

    t = _stage(8, f"Locust trajectories through the gateway: {users} agent(s), {policy} policy, {duration}")
    fleet.wait_ready(min(users, LAB_HOSTS * warm), READY_SECONDS)
    gw = fleet.gateway
    run_locust("trajectories", gw.url, gw.token, run_dir, users, duration, ["--policy", policy])
    timings["trajectories_seconds"] = time.monotonic() - t
    print(_trajectory_line(run_dir), flush=True)


def _report(
    run_dir: Path, image: GoldenImage, machine: dict[str, Any], timings: dict[str, float], started: float
) -> None:
    from osfleet.report import render

    _stage(9, "report")
    timings["total_seconds"] = time.monotonic() - started
    _write_json(
        run_dir / "run.json",
        {"image": image.name, "image_manifest": image.manifest, "timings": timings, "machine": machine},
    )
    for path in render(run_dir):
        print(path)
    print(_cost_line(run_dir), flush=True)
    print(f"\ndone in {time.monotonic() - started:.0f} s: {run_dir}", flush=True)


def _cost_line(run_dir: Path) -> str:
    """The report's cost on the aws stack's default host type (c5.metal On-Demand), measured figures only."""
    from osfleet.report import load

    cost = load(run_dir).cost
    row = next((r for r in cost.rows if r["host"] == "aws-c5.metal-on-demand"), None) if cost else None
    if row is None:
        return "cost: not measured in this run"
    parts = [f"{row['usd_per_replica_day']:.3f} USD per active replica-day"]
    if row.get("usd_per_parked_replica_day") is not None:
        parts.append(f"{row['usd_per_parked_replica_day']:.4f} per parked one")
    if row.get("usd_per_1000_steps") is not None:
        parts.append(f"{row['usd_per_1000_steps']:.4f} per 1,000 steps")
    return "cost on c5.metal On-Demand (footprints measured here): " + ", ".join(parts)


def _overhead_line(over: dict[str, float]) -> str:
    return (
        f"gateway adds {over['added_p50_ms']:.1f} ms to a step at p50 "
        f"(direct {over['direct_p50_ms']:.1f} ms, through it {over['gateway_p50_ms']:.1f} ms)"
    )


def _infra_line(result: dict[str, Any]) -> str:
    left = sum((result.get("leftovers") or {}).values())
    return (
        f"{result['engine']}: up {result.get('up_seconds')} s, second up "
        f"{result.get('second_up_changes')} changes, destroy {result.get('destroy_seconds')} s, "
        f"{left} leftovers"
    )


def _bringup_line(run_dir: Path) -> str:
    lines = (run_dir / "bringup.jsonl").read_text().splitlines() if (run_dir / "bringup.jsonl").exists() else []
    if not lines:
        return "bring-up: no result"
    doc = json.loads(lines[-1])
    if doc.get("error"):
        return f"bring-up: the request for {doc.get('requested')} replicas was refused ({doc['error']})"
    total = doc.get("all_ready_seconds")
    return f"bring-up: {doc['ready']}/{doc['requested']} replicas ready" + (
        f", all after {total:.1f} s" if total else ""
    )


def _trajectory_line(run_dir: Path) -> str:
    from osfleet.report.load import load_test_results, trajectory_summary

    rows = load_test_results(run_dir).trajectories
    if not rows:
        return "trajectories: none finished"
    s = trajectory_summary(rows)
    per_host = ", ".join(f"{h} {n}" for h, n in s["scored_by_host"].items())
    return (
        f"trajectories: {s['scored']} scored ({s['successful']} successful; by host: {per_host or 'none'}), "
        f"{s['aborted']} unscored aborts, {s['interrupted']} cut short by the time limit, "
        f"{s['per_minute']:.1f} per minute across hosts"
    )
