"""Reading a run directory: the benchmarks' JSON, Locust's CSV and the JSONL results, and the cost rows
computed from them with the shipped price table. Nothing here draws or writes."""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osfleet.errors import OsfleetError
from osfleet.measure.cost import Footprint, cost_table, footprint_from_density, load_prices

# What a report is made of; a run directory with none of them has nothing to show.
RESULT_FILES = (
    "boot.json",
    "disk.json",
    "reset.json",
    "density.json",
    "infra.json",
    "chaos.json",
    "throughput.json",
    "bringup.jsonl",
    "trajectories-*.jsonl",
)
# The processes of the fleet itself whose CPU a step costs (``osfleet.bench.cpu_use``'s kinds; not the load
# generator, which stands in for the trainers' agents, nor the machine's other work).
FLEET_PROCESSES = ("qemu", "host_agents", "evaluation_jail", "gateway", "libvirt")
# An episode written without a status (Locust stopped before osfleet marked cut episodes) was cut short.
INTERRUPTED = "interrupted"
# Key spellings of run directories written before every bench said p50 (read, never written).
_OLD_KEYS = {"seconds_per_replica_median": "seconds_per_replica_p50"}
_OLD_BOOT_KEYS = {"overlay_allocated_bytes_median": "overlay_allocated_bytes_p50"}


@dataclass(frozen=True)
class LoadTest:
    """The Locust part of a run: episodes, host samples, request statistics, bring-up."""

    trajectories: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    stats: list[dict[str, str]] = field(default_factory=list)
    bringup: list[dict[str, Any]] = field(default_factory=list)
    caption: str = "machine not recorded in this run directory"


@dataclass(frozen=True)
class Cost:
    """What the fleet costs: the footprints measured in the run (an active replica's; a parked one's, from the
    density bench; the CPU of a step), and one row per priced host type (``osfleet.measure.cost.cost_table``)."""

    footprint: Footprint
    footprint_text: str
    rows: list[dict[str, Any]]
    prices: dict[str, Any]
    parked_text: str | None = None
    step_text: str | None = None
    cpu_seconds_per_step: float | None = None


@dataclass(frozen=True)
class RunResults:
    run_dir: Path
    disk: dict[str, Any] | None
    boot: dict[str, Any] | None
    resets: dict[str, Any] | None
    load: LoadTest
    cost: Cost | None
    density: dict[str, Any] | None = None  # density.json from ``osfleet bench density --out``
    chaos: dict[str, Any] | None = None  # chaos.json from ``osfleet bench chaos`` (its run directory)
    infra: dict[str, Any] | None = None  # infra.json from ``osfleet bench infra --out RUN_DIR/infra.json``
    fleet_samples: list[dict[str, Any]] = field(default_factory=list)  # bench chaos: the gateway's view
    forks: dict[str, Any] | None = None  # fork.json from ``osfleet bench fork --out RUN_DIR/fork.json``
    throughput: dict[str, Any] | None = None  # throughput.json from ``osfleet bench throughput``


def load(run_dir: Path) -> RunResults:
    """Everything a report shows, read from ``run_dir``; refuses a directory with no results."""
    disk = _json(run_dir, "disk.json")
    boot = _json(run_dir, "boot.json")
    resets = _json(run_dir, "reset.json")
    load_test = load_test_results(run_dir)
    if (
        disk is None
        and boot is None
        and resets is None
        and not load_test.trajectories
        and not load_test.bringup
        and not any(
            (run_dir / name).exists()
            for name in ("density.json", "infra.json", "chaos.json", "fork.json", "throughput.json")
        )
    ):
        if not run_dir.is_dir():
            raise OsfleetError(f"{run_dir} is not a directory: give the run directory a command wrote")
        raise OsfleetError(
            f"{run_dir} holds none of the results a report reads ({', '.join(RESULT_FILES)}): "
            "the run wrote nothing yet (run 'osfleet bench all', a bench with --out, or Locust with --run-dir)"
        )
    if disk is not None:
        _rename_old_keys(disk)
    density = _json(run_dir, "density.json")
    throughput = _json(run_dir, "throughput.json")
    cost = _cost(resets, load_test, density, throughput)
    chaos, infra = _json(run_dir, "chaos.json"), _json(run_dir, "infra.json")
    fleet = _jsonl(run_dir / "fleet-samples.jsonl")
    forks = _json(run_dir, "fork.json")
    return RunResults(run_dir, disk, boot, resets, load_test, cost, density, chaos, infra, fleet, forks, throughput)


def caption(machine: dict[str, Any]) -> str:
    """What every figure and section names: machine, accelerator, date and command."""
    return (
        f"{machine.get('hostname')} ({machine.get('cpus')} CPUs, {machine.get('memory_gib')} GiB), "
        f"{machine.get('accelerator') or 'accelerator n/a'}, {machine.get('date')}, "
        f"command: {machine.get('command') or 'osfleet bench'}"
    )


def machine_of(run_dir: Path) -> dict[str, Any]:
    """The machine the run was measured on (hostname, CPUs, accelerator, date, command), from its first result
    file that records one; empty when none does."""
    names = ("run.json", "reset.json", "boot.json", "disk.json", "chaos.json", "throughput.json", "density.json")
    for name in (*names, "fork.json"):
        doc = _json(run_dir, name)
        if doc and doc.get("machine"):
            return dict(doc["machine"])
    return {}


def load_test_results(run_dir: Path) -> LoadTest:
    stats: list[dict[str, str]] = []
    if (run_dir / "trajectories_stats.csv").exists():
        with open(run_dir / "trajectories_stats.csv") as f:
            stats = list(csv.DictReader(f))
    machine = machine_of(run_dir)
    trajectories = [row for f in sorted(run_dir.glob("trajectories-*.jsonl")) for row in _jsonl(f)]
    for row in trajectories:
        row.setdefault("status", INTERRUPTED)
    return LoadTest(
        trajectories=trajectories,
        samples=[_one_host(s) for s in _jsonl(run_dir / "samples.jsonl") if "error" not in s],
        stats=stats,
        bringup=_jsonl(run_dir / "bringup.jsonl"),
        caption=caption(machine) if machine else LoadTest.caption,
    )


def _one_host(sample: dict[str, Any]) -> dict[str, Any]:
    """A fleet gateway's ``/v1/host`` sample (one per host) summed into one host's shape; a host's as it is."""
    if "hosts" not in sample:
        return sample
    hosts = [h["sample"] for h in sample["hosts"].values() if h.get("sample")]
    replicas: dict[str, int] = {}
    disk: dict[str, int] = {}
    counters: dict[str, int] = {}
    for h in hosts:
        for k, v in (h.get("replicas") or {}).items():
            replicas[k] = replicas.get(k, 0) + v
        for k, v in (h.get("disk_allocated_bytes") or {}).items():
            disk[k] = disk.get(k, 0) + v
        for k, v in (h.get("counters") or {}).items():
            counters[k] = counters.get(k, 0) + v
    busy = [h["cpu_busy_share"] for h in hosts if h.get("cpu_busy_share") is not None]
    rss = [r for r in ((h.get("capacity") or {}).get("rss_bytes_per_replica") for h in hosts) if r]
    return {
        "time": sample["time"],
        "replicas": replicas,
        "disk_allocated_bytes": {"golden": 0, "overlays": 0, "saved_states": 0, **disk},
        "counters": counters,
        "cpu_busy_share": max(busy) if busy else None,  # hosts on one machine share its CPU: not a sum
        "cpus": max((h.get("cpus") or 0) for h in hosts) if hosts else 0,
        "memory_used_bytes": max((h.get("memory_used_bytes") or 0) for h in hosts) if hosts else 0,
        "capacity": {"rss_bytes_per_replica": sum(rss) / len(rss) if rss else None},
    }


def trajectory_summary(traj: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [t for t in traj if t["status"] == "scored"]
    aborted = [t for t in traj if t["status"] == "aborted"]
    errors = [t for t in traj if t["status"] == "error"]
    interrupted = [t for t in traj if t["status"] == INTERRUPTED]
    span_min = (max(t["t_end"] for t in traj) - min(t["t_start"] for t in traj)) / 60 if traj else 0
    return {
        "scored": len(scored),
        "successful": sum(bool(t.get("success")) for t in scored),
        "aborted": len(aborted),
        "errors": len(errors),
        "interrupted": len(interrupted),
        "scored_by_host": _by_host(scored),
        "per_minute": len(scored) / span_min if span_min else 0.0,
        "abort_share": len(aborted) / len(traj) if traj else 0.0,
        "mean_reward": sum(t["reward"] for t in scored) / len(scored) if scored else 0.0,
    }


def _by_host(traj: list[dict[str, Any]]) -> dict[str, int]:
    """Episodes per host, for replica ids a fleet gateway gave (``<host>.<replica>``); empty otherwise."""
    out: dict[str, int] = {}
    for t in traj:
        host, dot, _ = str(t.get("replica", "")).partition(".")
        if dot:
            out[host] = out.get(host, 0) + 1
    return dict(sorted(out.items()))


def _cost(
    resets: dict[str, Any] | None,
    load_test: LoadTest,
    density: dict[str, Any] | None,
    throughput: dict[str, Any] | None,
) -> Cost | None:
    """The cost rows from whatever the run measured: an active replica's footprint (CPU from the host samples
    under load, RAM from the reset bench or the hosts' own count), a parked one's (the density bench), the CPU
    of a step (the load's episodes); None when it measured no footprint at all."""
    active = _active_footprint(resets, load_test)
    parked = _parked_footprint(density)
    if active is None and parked is None:
        return None
    step = _step_cpu(load_test, throughput)
    if active is None:  # only a density run: its replicas, idle, are the footprint there is
        assert parked is not None
        active = parked
    meta, hosts = load_prices()
    rows = cost_table(
        hosts, active[0], parked[0] if parked else None, step[0] if step else None
    )  # fmt: skip
    return Cost(
        footprint=active[0],
        footprint_text=active[1],
        rows=[{**r, "footprint": active[1]} for r in rows],
        prices=meta,
        parked_text=parked[1] if parked else None,
        step_text=step[1] if step else None,
        cpu_seconds_per_step=step[0] if step else None,
    )


def _active_footprint(resets: dict[str, Any] | None, load_test: LoadTest) -> tuple[Footprint, str] | None:
    """Footprint per active replica from the host samples under load (CPU, disk) and the reset bench (RAM), or
    the hosts' own measure of their replicas' memory where the run had no reset bench."""
    samples = [x for x in load_test.samples if x.get("cpu_busy_share") is not None]
    active = [x["replicas"].get("ready", 0) + x["replicas"].get("leased", 0) for x in samples]
    if not samples or not any(active):
        return None
    cpu = sum(x["cpu_busy_share"] * x["cpus"] for x in samples) / sum(active)
    if resets:
        memory = (resets.get("hold") or {}).get("memory_bytes_per_replica") or resets["snapshot"][
            "rss_bytes_per_replica"
        ]
        where = "reset bench"
    else:
        rss = [r for r in ((x.get("capacity") or {}).get("rss_bytes_per_replica") for x in samples) if r]
        if not rss:
            return None
        memory, where = sum(rss) / len(rss), "the hosts' samples"
    disk = sum(x["disk_allocated_bytes"]["overlays"] for x in samples) / sum(active)
    text = (
        f"{cpu:.2f} CPU cores (under the load test), {memory / 2**20:.0f} MiB RAM ({where}), "
        f"{disk / 2**20:.1f} MiB disk"
    )
    return Footprint(cpu_cores=cpu, memory_bytes=memory, disk_bytes=disk), text


def _parked_footprint(density: dict[str, Any] | None) -> tuple[Footprint, str] | None:
    """A parked replica's footprint from ``osfleet bench density``: its memory per held replica, its idle CPU."""
    if density is None or not density.get("mib_per_replica"):
        return None
    fp = footprint_from_density(density)
    sharing = "template memory" if density.get("template_sharing") else "no template memory"
    text = (
        f"{fp.memory_bytes / 2**20:.1f} MiB RAM and {fp.cpu_cores:.4f} CPU cores each "
        f"(bench density: {density.get('held_ready')} held, {sharing})"
    )
    return fp, text


def _step_cpu(load_test: LoadTest, throughput: dict[str, Any] | None) -> tuple[float, str] | None:
    """CPU seconds a step costs the fleet: the CPU the run's load used over the steps its episodes took, resets
    and evaluations included. From ``bench throughput``'s accounting by process (the fleet's processes only:
    QEMU, host agents, the jail, the gateway, libvirt) where the run has it, else from the hosts' samples of the
    machine's busy share while the load ran."""
    traj = load_test.trajectories
    steps = sum(int(t.get("steps") or 0) for t in traj)
    if not steps:
        return None
    per_episode = steps / len(traj)
    core_seconds = (((throughput or {}).get("cpu") or {}).get("core_seconds")) or {}
    if core_seconds:
        fleet = sum(float(core_seconds.get(k) or 0) for k in FLEET_PROCESSES)
        how = "the fleet's processes, bench throughput"
    else:
        start, end = min(float(t["t_start"]) for t in traj), max(float(t["t_end"]) for t in traj)
        during = [x for x in load_test.samples if x.get("cpu_busy_share") is not None and start <= x["time"] <= end]
        samples = sorted(during, key=lambda x: float(x["time"]))  # each: the busy share since the one before
        if len(samples) < 2:
            return None
        fleet = sum(b["cpu_busy_share"] * b["cpus"] * (b["time"] - a["time"]) for a, b in itertools.pairwise(samples))
        how = "the machine's busy share sampled under the load"
    if fleet <= 0:
        return None
    text = (
        f"{fleet / steps:.3f} CPU core-seconds a step ({how}; {steps} steps in {len(traj)} episodes, "
        f"{per_episode:.1f} an episode, their resets and evaluations included)"
    )
    return fleet / steps, text


def _rename_old_keys(disk: dict[str, Any]) -> None:
    for s in disk.get("strategies", {}).values():
        for old, new in _OLD_KEYS.items():
            if old in s:
                s.setdefault(new, s.pop(old))
    boot = disk.get("boot") or {}
    for old, new in _OLD_BOOT_KEYS.items():
        if old in boot:
            boot.setdefault(new, boot.pop(old))


def _json(run_dir: Path, name: str) -> dict[str, Any] | None:
    path = run_dir / name
    if not path.exists():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except ValueError as exc:
        raise OsfleetError(f"{path} is not valid JSON: {exc}") from None
    return data


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The file's records; a last line cut off by a killed writer (no newline yet) is left out."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        try:
            json.loads(lines[-1])
        except ValueError:
            lines.pop()
    try:
        return [json.loads(line) for line in lines if line.strip()]
    except ValueError as exc:
        raise OsfleetError(f"{path} is not valid JSON lines: {exc}") from None
