"""The main job: golden image -> one replica booted and screenshotted -> disk bench -> reset bench -> a local
host agent -> Locust bring-up and trajectories -> report, all in one run directory. Ctrl-C at any point
stops Locust and the agent and retires the agent's replicas (context managers all the way down)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from osfleet.bench import disk as disk_bench
from osfleet.bench.tables import disk_table
from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.images import load
from osfleet.machine import describe


def _stage(n: int, total: int, title: str) -> float:
    print(f"\n== [{n}/{total}] {title}", flush=True)
    return time.monotonic()


def run(
    runs_dir: Path,
    replicas: int,
    reset_replicas: int = 2,
    resets: int = 2,
    bringup_replicas: int = 4,
    users: int = 2,
    duration: str = "90s",
    policy: str = "oracle",
) -> Path:
    from fabric import Config  # noqa: F401  (Fabric is a hard dependency of the build)
    from invoke import Context

    from osfleet.imaging import builder
    from osfleet.imaging.host import Host
    from osfleet.report import render
    from osfleet.verify import verify_image

    settings = Settings.from_env()
    run_dir = runs_dir / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir.mkdir(parents=True)
    print(f"osfleet main job; results in {run_dir}", flush=True)
    total = 7
    timings: dict[str, float] = {}

    t = _stage(1, total, "golden image (built once, then a cache hit)")
    files = builder.build(Host(Context()), builder.DEFAULT_RECIPE, str(settings.build_dir))
    image = load(Path(files.manifest))
    timings["image_seconds"] = time.monotonic() - t

    t = _stage(2, total, "boot one replica to a drawn desktop and save its screenshot")
    boot = verify_image(image, run_dir / "screenshot.png", settings)
    boot_doc: dict[str, Any] = {
        "benchmark": "boot",
        "image": image.name,
        "accelerator": boot.accel,
        "agent_seconds": boot.agent_seconds,
        "desktop_seconds": boot.desktop_seconds,
        "overlay_allocated_bytes_after_boot": boot.overlay_allocated_bytes,
        "screenshot": "screenshot.png",
        "machine": describe(boot.accel),
    }
    (run_dir / "boot.json").write_text(json.dumps(boot_doc, indent=2) + "\n")
    print(
        f"guest agent after {boot.agent_seconds:.1f} s, desktop drawn after {boot.desktop_seconds:.1f} s",
        flush=True,
    )
    timings["boot_seconds"] = time.monotonic() - t

    t = _stage(3, total, f"disk bench: {replicas} replicas by overlay, reflink and full copy")
    result = disk_bench.run(image, replicas, settings)
    result["machine"] = describe(boot.accel)
    (run_dir / "disk.json").write_text(json.dumps(result, indent=2) + "\n")
    print(disk_table(result), flush=True)
    timings["disk_bench_seconds"] = time.monotonic() - t

    t = _stage(4, total, f"reset bench: {reset_replicas} replicas, {resets} cold and {resets} snapshot resets each")
    from osfleet.bench import reset as reset_bench
    from osfleet.bench.tables import reset_table

    resets_doc = reset_bench.run(image, reset_replicas, resets, settings=settings)
    (run_dir / "reset.json").write_text(json.dumps(resets_doc, indent=2) + "\n")
    if resets_doc.get("failure"):  # what it measured is in reset.json; the main job stops here
        raise OsfleetError(f"reset bench: {resets_doc['failure']}")
    print(reset_table(resets_doc), flush=True)
    timings["reset_bench_seconds"] = time.monotonic() - t

    from osfleet.bench.load import local_agent, run_locust

    t = _stage(5, total, f"host agent on loopback; Locust bring-up of {bringup_replicas} replicas at once")
    with local_agent(warm=users, log=run_dir / "agent.log", image=image.name) as agent:
        run_locust("bringup", agent.url, agent.token, run_dir, 1, "15m", ["--replicas", str(bringup_replicas)])
        timings["bringup_seconds"] = time.monotonic() - t
        print(_bringup_line(run_dir), flush=True)

        t = _stage(6, total, f"Locust trajectories: {users} agent(s), {policy} policy, {duration}")
        agent.wait_ready(min(users, 1), 300)
        run_locust("trajectories", agent.url, agent.token, run_dir, users, duration, ["--policy", policy])
        timings["trajectories_seconds"] = time.monotonic() - t
        print(_trajectory_line(run_dir), flush=True)
        print("stopping the host agent and retiring the replicas it made", flush=True)

    t = _stage(7, total, "report")
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "image": image.name,
                "image_manifest": image.manifest,
                "timings": timings,
                "machine": describe(boot.accel),
            },
            indent=2,
        )
        + "\n"
    )
    for path in render(run_dir):
        print(path)
    print(f"\ndone: {run_dir}", flush=True)
    return run_dir


def _bringup_line(run_dir: Path) -> str:
    lines = (run_dir / "bringup.jsonl").read_text().splitlines() if (run_dir / "bringup.jsonl").exists() else []
    if not lines:
        return "bring-up: no result"
    doc = json.loads(lines[-1])
    total = doc["all_ready_seconds"]
    return f"bring-up: {doc['ready']}/{doc['requested']} replicas ready" + (
        f", all after {total:.1f} s" if total else ""
    )


def _trajectory_line(run_dir: Path) -> str:
    rows = [json.loads(x) for f in run_dir.glob("trajectories-*.jsonl") for x in f.read_text().splitlines()]
    scored = [r for r in rows if r["status"] == "scored"]
    aborted = sum(r["status"] == "aborted" for r in rows)
    if not rows:
        return "trajectories: none finished"
    span = (max(r["t_end"] for r in rows) - min(r["t_start"] for r in rows)) / 60
    ok = sum(bool(r.get("success")) for r in scored)
    return (
        f"trajectories: {len(scored)} scored ({ok} successful), {aborted} unscored aborts, "
        f"{len(scored) / span:.1f} per minute"
    )
