"""``osfleet bench throughput``: scored trajectories a minute through a fleet gateway on this machine, and where
each trajectory's time and CPU go.

The fleet is the chaos bench's (``bench.chaos``: host agents on loopback, each with its own tmpfs home and
replica-name prefix, a real ``osfleet fleet serve`` in front) with no fault injected; the load is Locust's
``trajectories`` scenario with the oracle policy over the built-in tasks (lease, reset to the task, the oracle's
steps with an observation each, evaluate, release). Reported:

- ``trajectories_per_min``: episodes scored within the measured ``--minutes`` (from the first agent's start),
  over those minutes; ``aborted``: episodes that ended unscored (an infrastructure abort or a refused request);
  episodes cut short when the time was up are counted apart (``cut_at_end``), as no one's failure;
- ``stages``: where an episode's wall time goes, from the agents' own clocks (lease, reset, steps, evaluate,
  release) and, inside the hosts' answers, their ``Server-Timing`` stages (relayed by the gateway);
- ``cpu``: the machine's CPU over the window by kind of process (``bench.cpu_use``: QEMU, host agents, the
  evaluation jail, the gateway, the load generator, libvirt), in all and per scored trajectory: on a 2-core
  machine the CPU a trajectory costs bounds how many fit in a minute.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from osfleet.bench.chaos import AGENT_START_SECONDS, BenchHost, Gateway, _leaks, _ready, _wait, teardown
from osfleet.bench.cpu_use import CpuUse
from osfleet.bench.load import _get, run_locust
from osfleet.cli_support import emit, friendly
from osfleet.config import Settings
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import percentile
from osfleet.vm.images import GoldenImage

Say = Callable[[str], None]
PHASES = ("lease", "reset", "steps", "evaluate", "release")
GOAL_PER_MINUTE = 60.0


def run(
    image: GoldenImage,
    settings: Settings,
    run_dir: Path,
    minutes: float,
    hosts: int,
    warm: int,
    users: int,
    say: Say = print,
) -> dict[str, Any]:
    """The whole bench (see the module's docstring); the result is also written to ``run_dir/throughput.json``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    bench_root = settings.scratch_dir / f"throughput-{run_dir.name}"
    fleet = [BenchHost(f"h{i + 1}", i, bench_root / f"h{i + 1}", image, warm) for i in range(hosts)]
    gateway: Gateway | None = None
    result: dict[str, Any] = {
        "benchmark": "throughput",
        "minutes": minutes,
        "hosts": hosts,
        "warm_per_host": warm,
        "users": users,
        "policy": "oracle",
        "record": os.environ.get("OSFLEET_RECORD") == "1",
        "image": image.name,
        "machine": describe(),
    }
    try:
        say(f"[1/4] {hosts} host agents on loopback, {warm} warm replicas each")
        for h in fleet:
            h.prepare()
            h.start()
        _wait(lambda: all(_ready(h) >= warm for h in fleet), AGENT_START_SECONDS, "the hosts' warm pools", say)
        result["machine"] = describe(_accelerator(fleet[0]))
        say("[2/4] fleet gateway in front of them")
        gateway = Gateway(fleet, run_dir)
        gw = gateway
        _wait(lambda: _get(f"{gw.url}/health", timeout=2)[0] == 200, 60, "the gateway", say)
        say(f"[3/4] Locust: {users} oracle agents through the gateway for {minutes:g} min")
        started = time.time()
        with CpuUse() as cpu:
            run_locust(
                "trajectories", gateway.url, gateway.token, run_dir, users=users, run_time=f"{round(minutes * 60)}s",
                extra=["--policy", "oracle"], spawn_rate=float(users),
            )  # fmt: skip
        result.update(summarise(_episodes(run_dir), started, minutes, cpu.result(), cpu.seconds))
        result["cpu"]["others_top"] = cpu.others()  # the "other" processes: this bench's own, or the machine's
    except Exception as exc:  # what was measured is still reported, with the failure named (exit code 1)
        result["failure"] = str(as_osfleet(exc, "the throughput benchmark"))
        say(f"throughput bench failed: {result['failure']}")
    finally:
        say("[4/4] teardown")
        teardown(gateway, fleet, bench_root)
    result["leaks"] = _leaks(fleet, settings)
    (run_dir / "throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _accelerator(host: BenchHost) -> str | None:
    """What the host agent's replicas run under (``kvm`` or ``qemu``: TCG), as its ``/health`` tells its operator."""
    try:
        _, body = _get(f"{host.url}/health", headers={"Authorization": f"Bearer {host.token}"}, timeout=5)
    except (OSError, ValueError):
        return None
    accel = (body or {}).get("accelerator")
    return str(accel) if accel else None


def _episodes(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(run_dir.glob("trajectories-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def summarise(
    episodes: list[dict[str, Any]], started: float, minutes: float, cpu: dict[str, float], cpu_seconds: float
) -> dict[str, Any]:
    """The figures of a run from its episodes (the ``trajectories`` scenario's JSONL records) and the CPU used
    over ``cpu_seconds`` of it."""
    end = started + minutes * 60
    scored = [e for e in episodes if e.get("status") == "scored" and float(e.get("t_end", end + 1)) <= end]
    unscored = [e for e in episodes if e.get("status") in ("aborted", "error")]
    cut = [e for e in episodes if e.get("status") not in ("scored", "aborted", "error")]
    late = [e for e in episodes if e.get("status") == "scored" and float(e.get("t_end", end + 1)) > end]
    out: dict[str, Any] = {
        "trajectories_per_min": round(len(scored) / minutes, 2),
        "scored": len(scored),
        "successful": sum(1 for e in scored if e.get("success")),
        "mean_reward": round(sum(float(e.get("reward", 0)) for e in scored) / len(scored), 3) if scored else None,
        "aborted": len(unscored),
        "aborted_by_kind": {k: sum(1 for e in unscored if e["status"] == k) for k in ("aborted", "error")},
        "abort_reasons": sorted({str(e.get("abort_reason", ""))[:200] for e in unscored})[:10],
        "cut_at_end": len(cut) + len(late),
        "by_task": _by_task(scored),
        "stages": _stages(scored),
        "cpu": _cpu(cpu, len(scored), cpu_seconds),
        "goal_met": len(scored) / minutes >= GOAL_PER_MINUTE and not unscored,
    }
    return out


def _by_task(scored: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    tasks: dict[str, list[dict[str, Any]]] = {}
    for e in scored:
        tasks.setdefault(str(e.get("task")), []).append(e)
    return {
        t: {
            "scored": len(es),
            "successful": sum(1 for e in es if e.get("success")),
            "seconds_p50": round(percentile([sum(e.get("seconds", {}).values()) for e in es], 50), 3),
        }
        for t, es in sorted(tasks.items())
    }


def _stages(scored: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """p50, p95 and share of the whole per client-side phase; then the hosts' own stages inside them
    (``server.<request>.<stage>``, from ``Server-Timing``), each as seconds per trajectory (mean) and share."""
    if not scored:
        return {}
    whole = sum(sum(e.get("seconds", {}).values()) for e in scored) or 1.0
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        values = [float(e["seconds"][phase]) for e in scored if phase in e.get("seconds", {})]
        if values:
            out[phase] = {
                "p50": round(percentile(values, 50), 3),
                "p95": round(percentile(values, 95), 3),
                "share": round(sum(values) / whole, 3),
            }
    server: dict[str, float] = {}
    for e in scored:
        for name, seconds in (e.get("server_seconds") or {}).items():
            server[name] = server.get(name, 0.0) + float(seconds)
    for name, seconds in sorted(server.items()):
        out[f"server.{name}"] = {"mean": round(seconds / len(scored), 4), "share": round(seconds / whole, 3)}
    return out


def _cpu(cpu: dict[str, float], scored: int, seconds: float) -> dict[str, Any]:
    return {
        "core_seconds": cpu,
        "window_seconds": round(seconds, 1),
        "cores_busy": round(cpu["all"] / seconds, 3) if seconds else None,
        "per_trajectory_s": {k: round(v / scored, 3) for k, v in cpu.items()} if scored else None,
    }


def summary(r: dict[str, Any]) -> str:
    """The result in a few lines (``--json`` prints all of it)."""
    lines = [
        f"{r.get('trajectories_per_min')} scored trajectories a minute (goal >= {GOAL_PER_MINUTE:.0f}); "
        f"{r.get('scored')} scored, {r.get('successful')} successful, {r.get('aborted')} aborted, "
        f"{r.get('cut_at_end')} cut at the end; {r['users']} agents, {r['hosts']} hosts x {r['warm_per_host']} warm",
    ]
    for name, d in (r.get("stages") or {}).items():
        if "p50" in d:
            lines.append(f"  {name:>12}: p50 {d['p50']:.2f} s, p95 {d['p95']:.2f} s, {d['share']:.0%} of the time")
    per = (r.get("cpu") or {}).get("per_trajectory_s") or {}
    if per:
        lines.append(f"  CPU per trajectory: {per.get('all')} core-s in all; " + ", ".join(
            f"{k} {v}" for k, v in per.items() if k != "all" and v))  # fmt: skip
    if r.get("failure"):
        lines.append(f"  FAILED: {r['failure']}")
    return "\n".join(lines)


@click.command("throughput")
@click.option("--minutes", default=3.0, show_default=True, type=click.FloatRange(0.5, 1440),
              help="how long the agents run (the measured window)")  # fmt: skip
@click.option("--hosts", default=2, show_default=True, type=click.IntRange(1, 8), help="host agents on loopback")
@click.option("--warm", default=2, show_default=True, type=click.IntRange(1, 64), help="ready replicas per host")
@click.option(
    "--users",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Locust agents (on 2 TCG cores, 12 starve the guests: docs/benchmarks/2026-12-06-throughput.md)",
)
@click.option(
    "--record/--no-record",
    default=False,
    show_default=True,
    help="the host agents record every episode (host serve's default is off, as here)",
)
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None, help="default: runs/<timestamp>-throughput")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@friendly
def bench_throughput(
    minutes: float,
    hosts: int,
    warm: int,
    users: int,
    record: bool,
    image_ref: str | None,
    run_dir: Path | None,
    as_json: bool,
    out: Path | None,
) -> None:
    """Scored trajectories a minute through a fleet gateway (built-in tasks, oracle policy), aborts, and where each
    trajectory's time and CPU go, stage by stage."""
    from osfleet.vm.images import find_image

    os.environ["OSFLEET_RECORD"] = "1" if record else "0"  # the host agents started here inherit it
    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    run_dir = run_dir or Path("runs") / (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-throughput")
    result = run(find_image(image_ref, settings), settings, run_dir, minutes, hosts, warm, users, say)
    emit(result, as_json or "failure" in result, out, summary)
    if result.get("failure"):
        raise OsfleetError(f"the benchmark failed: {result['failure']}")
