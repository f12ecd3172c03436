"""The main job, the mission end to end: golden image -> one replica booted and screenshotted -> disk bench ->
reset bench (one host) -> two lab hosts deployed with the plain ``pulumi up --stack lab`` (osfleet's language
host) -> a fleet gateway over them -> Locust bring-up and trajectories through the gateway -> ``pulumi
destroy`` and ``lab down`` -> report, all in one run directory.

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
from typing import Any

from osfleet.bench import disk as disk_bench
from osfleet.bench.tables import disk_table
from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.host_facts import describe
from osfleet.images import load

TOTAL = 8
LAB_HOSTS = 2
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
    from invoke import Context

    from osfleet.bench.lab_fleet import LabFleet
    from osfleet.bench.load import run_locust
    from osfleet.imaging import builder
    from osfleet.imaging.host import Host
    from osfleet.report import render
    from osfleet.verify import verify_image

    settings = Settings.from_env()
    started = _STARTED[0] = time.monotonic()
    run_dir = runs_dir / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir.mkdir(parents=True)
    print(f"osfleet main job; results in {run_dir}", flush=True)
    timings: dict[str, float] = {}

    t = _stage(1, "golden image (built once, then a cache hit)")
    files = builder.build(Host(Context()), builder.DEFAULT_RECIPE, str(settings.build_dir))
    image = load(Path(files.manifest))
    timings["image_seconds"] = time.monotonic() - t

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
    (run_dir / "boot.json").write_text(json.dumps(boot_doc, indent=2) + "\n")
    print(
        f"guest agent after {boot.agent_seconds:.1f} s, desktop drawn after {boot.desktop_seconds:.1f} s",
        flush=True,
    )
    timings["boot_seconds"] = time.monotonic() - t

    t = _stage(3, f"disk bench: {replicas} replicas by overlay, reflink and full copy")
    result = disk_bench.run(image, replicas, settings)
    result["machine"] = machine
    (run_dir / "disk.json").write_text(json.dumps(result, indent=2) + "\n")
    print(disk_table(result), flush=True)
    timings["disk_bench_seconds"] = time.monotonic() - t

    t = _stage(4, f"reset bench: {reset_replicas} replicas, {resets} cold and {resets} snapshot resets each")
    from osfleet.bench import reset as reset_bench
    from osfleet.bench.tables import reset_table

    resets_doc = reset_bench.run(image, reset_replicas, resets, settings=settings)
    (run_dir / "reset.json").write_text(json.dumps(resets_doc, indent=2) + "\n")
    if resets_doc.get("failure"):  # what it measured is in reset.json; the main job stops here
        raise OsfleetError(f"reset bench: {resets_doc['failure']}")
    print(reset_table(resets_doc), flush=True)
    timings["reset_bench_seconds"] = time.monotonic() - t

    warm = max(1, -(-users // LAB_HOSTS))  # enough ready replicas across the hosts for every Locust agent
    t = _stage(5, f"{LAB_HOSTS} lab hosts, pulumi up --stack lab (plain CLI, {warm} warm per agent), fleet gateway")
    fleet = LabFleet(run_dir, LAB_HOSTS, warm, settings, _say)
    try:
        with fleet:
            timings["deploy_seconds"] = time.monotonic() - t
            gw = fleet.gateway
            over = fleet.result["gateway_overhead"]
            print(
                f"gateway adds {over['added_p50_ms']:.1f} ms to a step at p50 "
                f"(direct {over['direct_p50_ms']:.1f} ms, through it {over['gateway_p50_ms']:.1f} ms)",
                flush=True,
            )

            t = _stage(6, f"Locust bring-up of {bringup_replicas} replicas at once through the gateway")
            asked = fleet.wait_room(bringup_replicas, ROOM_SECONDS)
            if asked < bringup_replicas:
                print(
                    f"the fleet has room for {asked} more replica(s) now (its hosts' CPU): asking for that", flush=True
                )
            run_locust("bringup", gw.url, gw.token, run_dir, 1, "15m", ["--replicas", str(max(asked, 1))])
            timings["bringup_seconds"] = time.monotonic() - t
            print(_bringup_line(run_dir), flush=True)

            t = _stage(7, f"Locust trajectories through the gateway: {users} agent(s), {policy} policy, {duration}")
            fleet.wait_ready(min(users, LAB_HOSTS * warm), READY_SECONDS)
            run_locust("trajectories", gw.url, gw.token, run_dir, users, duration, ["--policy", policy])
            timings["trajectories_seconds"] = time.monotonic() - t
            print(_trajectory_line(run_dir), flush=True)
            print("taking the fleet down: gateway, pulumi destroy, lab down", flush=True)
            t = time.monotonic()
    finally:
        (run_dir / "infra.json").write_text(json.dumps(fleet.result, indent=2) + "\n")
    timings["teardown_seconds"] = time.monotonic() - t
    left = sum((fleet.result.get("leftovers") or {}).values())
    print(
        f"{fleet.result['engine']}: up {fleet.result.get('up_seconds')} s, second up "
        f"{fleet.result.get('second_up_changes')} changes, destroy {fleet.result.get('destroy_seconds')} s, "
        f"{left} leftovers",
        flush=True,
    )

    t = _stage(8, "report")
    timings["total_seconds"] = time.monotonic() - started
    (run_dir / "run.json").write_text(
        json.dumps(
            {"image": image.name, "image_manifest": image.manifest, "timings": timings, "machine": machine},
            indent=2,
        )
        + "\n"
    )
    for path in render(run_dir):
        print(path)
    print(f"\ndone in {time.monotonic() - started:.0f} s: {run_dir}", flush=True)
    return run_dir


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
