"""The report's PNG figures (matplotlib, Agg), drawn from loaded run results into the run directory.

Every figure carries its caption (machine, accelerator, date, command) and is closed after saving.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfleet.report.load import Cost, RunResults, caption, trajectory_summary

STRATEGY_COLOURS = {"overlay": "#2f7f4f", "reflink": "#3f6fbf", "full": "#bf4f3f"}
MODE_COLOURS = {"cold": "#bf4f3f", "snapshot": "#2f7f4f"}
API_REQUESTS = ("lease", "reset", "step", "evaluate", "release")
RATE_BIN_SECONDS = 30.0


@dataclass(frozen=True)
class Figure:
    file: str
    title: str


def draw(results: RunResults) -> list[Figure]:
    """Draw every figure the results allow, in report order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = results.run_dir
    figures: list[Figure] = []
    if results.disk is not None:
        figures += _disk(plt, out, results.disk)
    if results.boot is not None:
        figures.append(_boot(plt, out, results.boot))
    if results.resets is not None:
        figures += _resets(plt, out, results.resets)
    if results.load.trajectories or results.load.stats:
        figures += _load_test(plt, out, results)
    if results.density is not None and results.density.get("memory_curve"):
        figures.append(_density(plt, out, results.density))
    if results.chaos is not None and results.chaos.get("started_at"):
        figures.append(_chaos(plt, out, results))
        if results.fleet_samples:
            figures.append(_fleet_states(plt, out, results))
    if results.throughput is not None and results.throughput.get("stages"):
        figures.append(_throughput(plt, out, results.throughput))
    if results.cost is not None:
        figures.append(_cost(plt, out, results.cost, results.load.caption))
    return figures


def _throughput(plt: Any, out: Path, t: dict[str, Any]) -> Figure:
    """Where a scored episode's time goes (p50 of each stage, the agents' clocks) beside where the machine's CPU
    went per scored trajectory, by kind of process."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    stages = {k: v for k, v in t["stages"].items() if "p50" in v}
    left.barh(list(stages), [v["p50"] for v in stages.values()], color="#3f6fbf", label="p50")
    left.scatter([v["p95"] for v in stages.values()], list(stages), color="black", marker="|", s=300, label="p95")
    left.set_xlabel("seconds")
    left.set_title(f"An episode's stages ({t['trajectories_per_min']:.1f} scored a minute)", fontsize=10)
    left.legend(fontsize=7)
    per = {k: v for k, v in ((t.get("cpu") or {}).get("per_trajectory_s") or {}).items() if k != "all" and v}
    right.barh(list(per), list(per.values()), color="#bf8f3f")
    right.set_xlabel("CPU core-seconds per scored trajectory")
    right.set_title("Where the machine's CPU went", fontsize=10)
    _save(plt, fig, out / "throughput_stages.png", caption(t.get("machine", {})))
    return Figure("throughput_stages.png", "Where a trajectory's time and CPU go (bench throughput)")


def _fleet_states(plt: Any, out: Path, results: RunResults) -> Figure:
    """Replicas by state across the fleet over the chaos run, as the gateway saw them every 2 s."""
    t0 = float((results.chaos or {})["started_at"])
    states = ("ready", "leased", "resetting", "failed", "recovering", "booting")
    xs = [float(s["time"]) - t0 for s in results.fleet_samples]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for state in states:
        ys = [sum(1 for r in s["replicas"] if r["state"] == state) for s in results.fleet_samples]
        if any(ys):
            ax.plot(xs, ys, label=state, linewidth=1.2)
    for f in (results.chaos or {}).get("faults", []):
        ax.axvline(f["injected_at"], color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("seconds since the load started (dotted: a fault injected)")
    ax.set_ylabel("replicas")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title("Replicas by state across the fleet (gateway's view)", fontsize=9)
    _save(plt, fig, out / "fleet_states.png", results.load.caption)
    return Figure("fleet_states.png", "Replicas by state across the fleet during the chaos run")


def _chaos(plt: Any, out: Path, results: RunResults) -> Figure:
    """Faults (injection to recovery, one row per fault) above the episodes they met (end times)."""
    chaos = results.chaos or {}
    t0 = float(chaos["started_at"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), sharex=True, height_ratios=(2, 1))
    faults = chaos.get("faults", [])
    for i, f in enumerate(faults):
        start = f["injected_at"]
        end = start + (f["recovered_after_s"] or 0)
        color = "tab:red" if f["recovered_after_s"] is None else "tab:orange"
        top.plot([start, end], [i, i], color=color, linewidth=6, solid_capstyle="butt")
        top.text(end + 2, i, f"{f['kind']} {f['target']} ({f['layer']})", va="center", fontsize=7)
    top.set_yticks([])
    top.set_title("Faults: injected until their target served again (red: never)", fontsize=9)
    scored = [float(e["t_end"]) - t0 for e in results.load.trajectories if e.get("status") == "scored"]
    aborted = [float(e["t_end"]) - t0 for e in results.load.trajectories if e.get("status") != "scored"]
    bottom.scatter(scored, [1] * len(scored), marker="|", color="tab:green", label=f"scored ({len(scored)})")
    bottom.scatter(aborted, [0] * len(aborted), marker="x", color="tab:red", label=f"unscored ({len(aborted)})")
    bottom.set_yticks([0, 1], ["unscored", "scored"])
    bottom.set_xlabel("seconds since the load started")
    bottom.legend(fontsize=7, loc="upper right")
    _save(plt, fig, out / "chaos_timeline.png", results.load.caption)
    return Figure("chaos_timeline.png", "Chaos run: faults and the episodes around them")


DENSITY_COLOURS = ("#2f7f4f", "#3f6fbf", "#bf8f3f", "#7f3fbf")


def _density(plt: Any, out: Path, d: dict[str, Any]) -> Figure:
    """Host memory per replica against the number of replicas held (every MiB-per-replica series a point has:
    all of it, and a private/shared split where the bench measured one), template memory on vs off."""
    fig, ax = plt.subplots(figsize=(7, 4))
    runs = [d, d.get("sharing_off")]
    for run in (r for r in runs if r and r.get("memory_curve")):
        on = bool(run.get("template_sharing"))
        curve = run["memory_curve"]
        series = [k for k in curve[0] if k != "replicas" and k.endswith("mib_per_replica")]
        for i, name in enumerate(series):
            label = name.removesuffix("_mib_per_replica").replace("_", " ") if name != "mib_per_replica" else "all"
            ax.plot(
                [p["replicas"] for p in curve],
                [p.get(name) for p in curve],
                marker="o",
                markersize=3,
                linestyle="-" if on else "--",
                color=DENSITY_COLOURS[i % len(DENSITY_COLOURS)] if on else "#bf4f3f",
                label=f"{label}, template memory {'on' if on else 'off'}: {run['held_ready']} held "
                f"({run['stop_reason']})",
            )
    ax.set_xlabel("replicas held ready")
    ax.set_ylabel("host memory per replica, MiB")
    ax.set_ylim(bottom=0)
    ax.set_title("Memory per replica against replica count")
    ax.legend(fontsize=6)
    _save(plt, fig, out / "density_memory.png", caption(d.get("machine", {})))
    return Figure("density_memory.png", "Memory per replica against replica count (the density curve)")


def _disk(plt: Any, out: Path, disk: dict[str, Any]) -> list[Figure]:
    text = caption(disk.get("machine", {}))
    strategies = {k: v for k, v in disk["strategies"].items() if v.get("available")}
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(strategies)
    ax.bar(
        names,
        [strategies[n]["seconds_per_replica_p50"] for n in names],
        color=[STRATEGY_COLOURS[n] for n in names],
        label="p50",
    )
    p95 = [strategies[n]["seconds_per_replica_p95"] for n in names]
    ax.scatter(names, p95, color="black", marker="_", s=400, label="p95", zorder=3)
    ax.set_yscale("log")
    ax.set_ylabel("seconds per replica disk (log)")
    ax.set_title(f"Provisioning time by disk strategy ({disk['replicas']} replicas)")
    ax.legend()
    _save(plt, fig, out / "provisioning_time.png", text)

    fig, ax = plt.subplots(figsize=(7, 4))
    n_max = disk["replicas"]
    xs = list(range(1, n_max + 1))
    golden = disk["golden_allocated_bytes"]
    for name, s in strategies.items():
        per = s["replica_allocated_bytes_total"] / n_max
        base = 0 if name == "full" else golden
        ax.plot(xs, [(base + per * x) / 2**30 for x in xs], label=name, color=STRATEGY_COLOURS[name])
    ax.set_xlabel("replicas")
    ax.set_ylabel("allocated GiB (golden + replica disks)")
    ax.set_title("Disk use against replica count (from measured per-replica bytes)")
    ax.legend()
    _save(plt, fig, out / "disk_use.png", text)
    return [
        Figure("provisioning_time.png", "Provisioning time by disk strategy (log scale)"),
        Figure("disk_use.png", "Disk use against replica count"),
    ]


def _boot(plt: Any, out: Path, boot: dict[str, Any]) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(
        ["guest agent answers", "desktop drawn"],
        [boot["agent_seconds"], boot["desktop_seconds"]],
        color=["#7f7f3f", "#3f6fbf"],
    )
    ax.set_xlabel("seconds from domain start")
    ax.set_title(f"Cold boot of one replica ({boot.get('machine', {}).get('accelerator')})")
    _save(plt, fig, out / "boot.png", caption(boot.get("machine", {})))
    return Figure("boot.png", "Cold boot to a drawn desktop")


def _resets(plt: Any, out: Path, r: dict[str, Any]) -> list[Figure]:
    text = caption(r.get("machine", {}))
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, colour in MODE_COLOURS.items():
        xs = sorted(r[mode]["samples"])
        ax.step(
            xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{mode} (n={len(xs)})", color=colour
        )
    ax.set_xscale("log")
    ax.set_xlabel("reset latency, seconds (log)")
    ax.set_ylabel("share of resets")
    ax.set_ylim(0, 1.02)
    ax.set_title("Reset latency CDF: cold boot vs saved-state restore")
    ax.legend()
    _save(plt, fig, out / "reset_cdf.png", text)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    modes = list(MODE_COLOURS)
    ax.bar(modes, [r[m]["bringup_seconds"]["p50"] for m in modes], color=list(MODE_COLOURS.values()), label="p50")
    ax.scatter(
        modes, [r[m]["bringup_seconds"]["p95"] for m in modes], color="black", marker="_", s=400, label="p95", zorder=3
    )
    ax.set_ylabel("seconds to a ready replica")
    ax.set_title("Bring-up time per replica by mode")
    ax.legend()
    _save(plt, fig, out / "bringup.png", text)
    figures = [Figure("reset_cdf.png", "Reset latency CDF"), Figure("bringup.png", "Bring-up time per replica")]

    lat = r.get("latency", {})
    if lat:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = list(lat)
        labels = [n.removesuffix("_seconds").replace("_", " ") for n in names]
        ax.barh(labels, [lat[n]["p50"] * 1000 for n in names], color="#3f6fbf", label="p50")
        ax.scatter(
            [lat[n]["p95"] * 1000 for n in names], labels, color="black", marker="|", s=300, label="p95", zorder=3
        )
        ax.set_xlabel("milliseconds")
        ax.set_title("Observe / act latency on a ready replica")
        ax.legend()
        _save(plt, fig, out / "latency.png", text)
        figures.append(Figure("latency.png", "Observe / act latency"))
    return figures


def _load_test(plt: Any, out: Path, results: RunResults) -> list[Figure]:
    load = results.load
    figures = []
    traj = load.trajectories
    if traj:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        starts, rates, span = _rates(traj)
        ax.step(starts + [span / 60], rates + rates[-1:], where="post", color="#2f7f4f")
        ax.set_xlabel("minutes into the run")
        ax.set_ylabel("scored trajectories per minute")
        ax.set_title(f"Scored trajectories per minute over time ({RATE_BIN_SECONDS:.0f} s bins)")
        ax.set_ylim(bottom=0)
        _save(plt, fig, out / "trajectories_per_minute.png", load.caption)
        figures.append(Figure("trajectories_per_minute.png", "Trajectories per minute over time"))
    stats = [r for r in load.stats if r.get("Name") in API_REQUESTS]
    if stats:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = [r["Name"] for r in stats]
        for q, colour in (("50%", "#3f6fbf"), ("95%", "#bf8f3f"), ("99%", "#bf4f3f")):
            ax.scatter(names, [float(r[q]) / 1000 for r in stats], label=f"p{q[:-1]}", color=colour, s=60)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title("Request latency through the host agent API (Locust)")
        ax.legend()
        _save(plt, fig, out / "request_latency.png", load.caption)
        figures.append(Figure("request_latency.png", "Step, reset and evaluate latency percentiles"))

    summary = trajectory_summary(traj) if traj else {}
    counters = load.samples[-1].get("counters", {}) if load.samples else {}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = ["scored", "successful", "unscored aborts", "errors", "failures detected", "recoveries"]
    values = [
        summary.get("scored", 0),
        summary.get("successful", 0),
        summary.get("aborted", 0),
        summary.get("errors", 0),
        counters.get("failures_detected", 0),
        counters.get("recoveries", 0),
    ]
    ax.barh(labels, values, color=["#2f7f4f", "#5faf6f", "#bf4f3f", "#bf8f3f", "#7f7f7f", "#3f6fbf"])
    ax.set_xlabel("count in this run")
    ax.set_title("Episodes, aborts and recoveries")
    _save(plt, fig, out / "aborts_recoveries.png", load.caption)
    figures.append(Figure("aborts_recoveries.png", "Aborts and recoveries"))

    if load.samples:
        t0 = load.samples[0]["time"]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = [(x["time"] - t0) / 60 for x in load.samples]
        ax.plot(xs, [x["disk_allocated_bytes"]["overlays"] / 2**20 for x in load.samples], label="overlays (MiB)")
        ax2 = ax.twinx()
        ax2.plot(
            xs,
            [x["replicas"].get("ready", 0) + x["replicas"].get("leased", 0) for x in load.samples],
            color="#bf4f3f",
            label="replicas ready or leased",
        )
        ax.set_xlabel("minutes into the run")
        ax.set_ylabel("overlay MiB (allocated)")
        ax2.set_ylabel("replicas")
        ax.set_title("Disk use and replicas under load (sampled from the host agent)")
        _save(plt, fig, out / "disk_under_load.png", load.caption)
        figures.append(Figure("disk_under_load.png", "Disk use and replicas under load"))
    return figures


def _rates(traj: list[dict[str, Any]]) -> tuple[list[float], list[float], float]:
    """Scored trajectories per minute in fixed bins: bin starts (minutes), rates, and the run's span (s).
    The last bin may be partial; its rate is over its own width."""
    t0 = min(t["t_start"] for t in traj)
    ends = sorted(t["t_end"] - t0 for t in traj if t.get("status") == "scored")
    span = max(t["t_end"] for t in traj) - t0
    width = RATE_BIN_SECONDS
    bins = max(1, int(span // width) + (1 if span % width else 0))
    counts = [0] * bins
    for e in ends:
        counts[min(bins - 1, int(e // width))] += 1
    widths = [min(width, span - i * width) for i in range(bins)]
    rates = [c * 60 / w if w > 0 else 0.0 for c, w in zip(counts, widths, strict=True)]
    return [i * width / 60 for i in range(bins)], rates, span


def _cost(plt: Any, out: Path, cost: Cost, text: str) -> Figure:
    """USD per replica-day by host type (active, and parked where measured) and, beside it, USD per 1,000 steps."""
    rows = cost.rows
    steps = cost.cpu_seconds_per_step is not None
    fig, axes = plt.subplots(1, 2 if steps else 1, figsize=(11 if steps else 7, 4), squeeze=False)
    ax = axes[0][0]
    names = [r["host"] for r in rows]
    ys = list(range(len(rows)))
    active = [r["usd_per_replica_day"] or 0 for r in rows]
    parked = [r.get("usd_per_parked_replica_day") or 0 for r in rows]
    height = 0.4 if any(parked) else 0.8
    bars = ax.barh(
        [y + (height / 2 if any(parked) else 0) for y in ys], active, height, color="#3f6fbf", label="active"
    )
    for bar, r in zip(bars, rows, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['replicas_per_host']}/host "
                f"({r['binding_resource']})", va="center", fontsize=7)  # fmt: skip
    if any(parked):
        pbars = ax.barh([y - height / 2 for y in ys], parked, height, color="#2f7f4f", label="parked")
        for bar, r in zip(pbars, rows, strict=True):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['parked_replicas_per_host']}/host "
                    f"({r['parked_binding_resource']})", va="center", fontsize=7)  # fmt: skip
    ax.set_yticks(ys, names, fontsize=7)
    ax.axvspan(0.2, 0.3, color="#bf8f3f", alpha=0.2, label="OSGym, published: 0.2-0.3 USD")
    ax.set_xlim(0, max(active + [0.3]) * 1.6)
    ax.set_xlabel("USD per replica-day")
    ax.set_title("Cost per replica-day by host type", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    if steps:
        ax2 = axes[0][1]
        per = [r["usd_per_1000_steps"] for r in rows]
        ax2.barh(ys, per, color="#bf8f3f")
        ax2.set_yticks(ys, names, fontsize=7)
        ax2.set_xlabel(f"USD per 1,000 steps ({cost.cpu_seconds_per_step:.3f} core-s a step, measured here)")
        ax2.set_title("Cost per 1,000 steps by host type", fontsize=10)
    fig.suptitle("Footprints measured here, prices from osfleet/data/prices.yaml", fontsize=9)
    _save(plt, fig, out / "cost_per_replica_day.png", text)
    return Figure("cost_per_replica_day.png", "Cost per replica-day (active, parked) and per 1,000 steps by host type")


def _save(plt: Any, fig: Any, path: Path, text: str) -> None:
    fig.text(0.01, 0.01, text, fontsize=6)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
