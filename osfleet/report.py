"""Turn a run directory into report.md, report.html and PNG figures (matplotlib).

Only numbers found in the run directory's result files appear, each marked "measured here"; the report
covers whichever results the run holds (disk bench, boot), so later benchmarks add sections.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from osfleet.bench.tables import human_bytes, seconds
from osfleet.errors import OsfleetError

STRATEGY_COLOURS = {"overlay": "#2f7f4f", "reflink": "#3f6fbf", "full": "#bf4f3f"}


def _load(run_dir: Path, name: str) -> dict[str, Any] | None:
    path = run_dir / name
    if not path.exists():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except ValueError as exc:
        raise OsfleetError(f"{path} is not valid JSON: {exc}") from None


def _caption(machine: dict[str, Any]) -> str:
    return (
        f"{machine.get('hostname')} ({machine.get('cpus')} CPUs, {machine.get('memory_gib')} GiB), "
        f"{machine.get('accelerator') or 'accelerator n/a'}, {machine.get('date')}, "
        f"command: {machine.get('command') or 'osfleet bench'}"
    )


def render(run_dir: Path) -> list[Path]:
    """Write the report files into ``run_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    disk = _load(run_dir, "disk.json")
    boot = _load(run_dir, "boot.json")
    resets = _load(run_dir, "reset.json")
    load = load_results(run_dir)
    if disk is None and boot is None and resets is None and not load["trajectories"]:
        raise OsfleetError(
            f"{run_dir} holds no results (disk.json, boot.json, reset.json): run 'osfleet bench all' first"
        )
    figures: list[tuple[str, str]] = []
    md: list[str] = ["# osfleet run report", "", f"Run directory: `{run_dir}`", ""]
    rows: list[tuple[str, str, str]] = []

    if disk is not None:
        caption = _caption(disk.get("machine", {}))
        strategies = {k: v for k, v in disk["strategies"].items() if v.get("available")}
        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(strategies)
        med = [strategies[n]["seconds_per_replica_median"] for n in names]
        p95 = [strategies[n]["seconds_per_replica_p95"] for n in names]
        ax.bar(names, med, color=[STRATEGY_COLOURS[n] for n in names], label="median")
        ax.scatter(names, p95, color="black", marker="_", s=400, label="p95", zorder=3)
        ax.set_yscale("log")
        ax.set_ylabel("seconds per replica disk (log)")
        ax.set_title(f"Provisioning time by disk strategy ({disk['replicas']} replicas)")
        ax.legend()
        _save(plt, fig, run_dir / "provisioning_time.png", caption)
        figures.append(("provisioning_time.png", "Provisioning time by disk strategy (log scale)"))

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
        _save(plt, fig, run_dir / "disk_use.png", caption)
        figures.append(("disk_use.png", "Disk use against replica count"))

        md += [
            "## Disk provisioning",
            "",
            f"{disk['replicas']} replicas of `{disk['image']}`; {caption}.",
            "",
            "| strategy | median / replica | p95 / replica | allocated total | savings vs N full copies | source |",
            "|---|---|---|---|---|---|",
        ]
        for name, s in strategies.items():
            md.append(
                f"| {name} | {seconds(s['seconds_per_replica_median'])} | {seconds(s['seconds_per_replica_p95'])} | "
                f"{human_bytes(s['allocated_bytes_total'])} | {s['savings_vs_full_copies'] * 100:.1f}% "
                "| measured here |"
            )
        if disk["strategies"]["full"].get("sampled"):
            md += ["", f"Full copy: {disk['strategies']['full']['note']}."]
        md.append("")
        rows += [
            ("overlay speed-up vs full copy", f"{disk['speedup_overlay_vs_full']:.0f}x", "measured here"),
            ("disk savings (overlay)", f"{disk['savings_overlay'] * 100:.1f}%", "measured here"),
        ]

    if boot is not None:
        caption = _caption(boot.get("machine", {}))
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.barh(
            ["guest agent answers", "desktop drawn"],
            [boot["agent_seconds"], boot["desktop_seconds"]],
            color=["#7f7f3f", "#3f6fbf"],
        )
        ax.set_xlabel("seconds from domain start")
        ax.set_title(f"Cold boot of one replica ({boot['machine'].get('accelerator')})")
        _save(plt, fig, run_dir / "boot.png", caption)
        figures.append(("boot.png", "Cold boot to a drawn desktop"))
        md += [
            "## Boot",
            "",
            f"{caption}.",
            "",
            f"Guest agent answered after {boot['agent_seconds']:.1f} s, desktop drawn after "
            f"{boot['desktop_seconds']:.1f} s (measured here).",
            "",
        ]
        if (run_dir / str(boot.get("screenshot", ""))).exists():
            md += [f"![replica screenshot]({boot['screenshot']})", ""]
        rows.append(("cold boot to desktop", f"{boot['desktop_seconds']:.1f} s", "measured here"))

    if resets is not None:
        figures += _reset_figures(plt, run_dir, resets)
        caption = _caption(resets.get("machine", {}))
        md += [
            "## Resets",
            "",
            f"{resets['replicas']} replicas, {resets['resets_per_replica']} resets each per mode; "
            f"{caption}. Between resets: {resets['between_resets']}.",
            "",
            "| mode | reset p50 | reset p95 | bring-up p50 | RSS per replica | source |",
            "|---|---|---|---|---|---|",
        ]
        for mode in ("cold", "snapshot"):
            m = resets[mode]
            md.append(
                f"| {mode} | {seconds(m['p50'])} | {seconds(m['p95'])} | {seconds(m['bringup_seconds']['p50'])} | "
                f"{human_bytes(m['rss_bytes_per_replica'])} | measured here |"
            )
        md.append("")
        rows += [
            (
                "reset p50 / p95, snapshot",
                f"{seconds(resets['snapshot']['p50'])} / {seconds(resets['snapshot']['p95'])}",
                "measured here",
            ),
            (
                "reset p50 / p95, cold",
                f"{seconds(resets['cold']['p50'])} / {seconds(resets['cold']['p95'])}",
                "measured here",
            ),
            ("snapshot vs cold reset (p50)", f"{resets['speedup_snapshot_vs_cold']:.1f}x", "measured here"),
        ]
        for name, d in resets.get("latency", {}).items():
            rows.append((name.removesuffix("_seconds").replace("_", " ") + " p50", seconds(d["p50"]), "measured here"))

    if load["trajectories"] or load["stats"]:
        figures += _load_figures(plt, run_dir, load)
        md += _load_markdown(load, rows)
    cost_rows = _cost(run_dir, resets, load)
    if cost_rows:
        figures += _cost_figure(plt, run_dir, cost_rows, load)
        md += [
            "## Cost per replica-day",
            "",
            f"Footprint per replica measured here: {cost_rows[0]['footprint']}.",
            "Prices from the price table osfleet ships (osfleet/data/prices.yaml; each with its source and date).",
            "",
            "| host type | replicas per host | binding resource | USD per replica-day | source |",
            "|---|---|---|---|---|",
        ]
        for c in cost_rows:
            md.append(
                f"| {c['host']} | {c['replicas_per_host']} | {c['binding_resource']} | "
                f"{c['usd_per_replica_day']:.3f} | computed here from measured footprint + price table |"
            )
        md.append("")
        best = min(cost_rows, key=lambda c: c["usd_per_replica_day"] or 1e9)
        rows.append(
            (
                f"cost per replica-day ({best['host']})",
                f"{best['usd_per_replica_day']:.3f} USD, binding {best['binding_resource']}",
                "measured here (footprint) + price table",
            )
        )

    md += [
        "## Compared with published systems",
        "",
        "| figure | osfleet (this run) | OSGym | MAI-Gym |",
        "|---|---|---|---|",
    ]
    md += _comparison(disk, resets, load)
    md += ["", "## Key figures", "", "| figure | value | source |", "|---|---|---|"]
    md += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    md += ["", "## Figures", ""] + [f"![{t}]({f})" for f, t in figures] + [""]
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    md_path.write_text("\n".join(md))
    html_path.write_text(_html(md))
    return [md_path, html_path] + [run_dir / f for f, _ in figures]


def _html(md_lines: list[str]) -> str:
    """A small, dependency-free rendering of the report's Markdown subset (headings, tables, images)."""
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>osfleet run report</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #aaa;padding:.2em .6em}img{max-width:100%}</style></head><body>",
    ]
    in_table = False
    for line in md_lines:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-"):
                continue
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("## "):
            out.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            out.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](", 1)
            out.append(f"<p><img src='{html.escape(src.rstrip(')'))}' alt='{html.escape(alt)}'></p>")
        elif line:
            out.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def _reset_figures(plt: Any, run_dir: Path, r: dict[str, Any]) -> list[tuple[str, str]]:
    caption = _caption(r.get("machine", {}))
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, colour in (("cold", "#bf4f3f"), ("snapshot", "#2f7f4f")):
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
    _save(plt, fig, run_dir / "reset_cdf.png", caption)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    modes = ["cold", "snapshot"]
    ax.bar(modes, [r[m]["bringup_seconds"]["p50"] for m in modes], color=["#bf4f3f", "#2f7f4f"], label="p50")
    ax.scatter(
        modes, [r[m]["bringup_seconds"]["p95"] for m in modes], color="black", marker="_", s=400, label="p95", zorder=3
    )
    ax.set_ylabel("seconds to a ready replica")
    ax.set_title("Bring-up time per replica by mode")
    ax.legend()
    _save(plt, fig, run_dir / "bringup.png", caption)
    out = [("reset_cdf.png", "Reset latency CDF"), ("bringup.png", "Bring-up time per replica")]

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
        _save(plt, fig, run_dir / "latency.png", caption)
        out.append(("latency.png", "Observe / act latency"))
    return out


# --- load test results ---------------------------------------------------------------------------------------
def load_results(run_dir: Path) -> dict[str, Any]:
    import csv

    traj = [
        json.loads(line)
        for f in sorted(run_dir.glob("trajectories-*.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    samples = []
    if (run_dir / "samples.jsonl").exists():
        samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines() if x.strip()]
    stats: list[dict[str, str]] = []
    if (run_dir / "trajectories_stats.csv").exists():
        with open(run_dir / "trajectories_stats.csv") as f:
            stats = list(csv.DictReader(f))
    bringup = []
    if (run_dir / "bringup.jsonl").exists():
        bringup = [json.loads(x) for x in (run_dir / "bringup.jsonl").read_text().splitlines() if x.strip()]
    machine: dict[str, Any] = {}
    for name in ("run.json", "reset.json", "boot.json", "disk.json"):
        doc = _load(run_dir, name)
        if doc and doc.get("machine"):
            machine = doc["machine"]
            break
    return {
        "trajectories": traj,
        "samples": [s for s in samples if "error" not in s],
        "stats": stats,
        "bringup": bringup,
        "caption": _caption(machine) if machine else "machine not recorded in this run directory",
    }


def trajectory_summary(traj: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [t for t in traj if t["status"] == "scored"]
    aborted = [t for t in traj if t["status"] == "aborted"]
    errors = [t for t in traj if t["status"] == "error"]
    span_min = (max(t["t_end"] for t in traj) - min(t["t_start"] for t in traj)) / 60 if traj else 0
    return {
        "scored": len(scored),
        "successful": sum(bool(t.get("success")) for t in scored),
        "aborted": len(aborted),
        "errors": len(errors),
        "per_minute": len(scored) / span_min if span_min else 0.0,
        "abort_share": len(aborted) / len(traj) if traj else 0.0,
        "mean_reward": sum(t["reward"] for t in scored) / len(scored) if scored else 0.0,
    }


def _load_figures(plt: Any, run_dir: Path, load: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    traj = load["trajectories"]
    caption = load["caption"]
    if traj:
        t0 = min(t["t_start"] for t in traj)
        ends = sorted(t["t_end"] - t0 for t in traj if t["status"] == "scored")
        span = max(t["t_end"] for t in traj) - t0
        width = 30.0
        bins = max(1, int(span // width) + (1 if span % width else 0))
        counts = [0] * bins
        for e in ends:
            counts[min(bins - 1, int(e // width))] += 1
        widths = [min(width, span - i * width) for i in range(bins)]  # the last bin may be partial
        rates = [c * 60 / w if w > 0 else 0 for c, w in zip(counts, widths, strict=True)]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.step([i * width / 60 for i in range(bins)] + [span / 60], rates + rates[-1:], where="post", color="#2f7f4f")
        ax.set_xlabel("minutes into the run")
        ax.set_ylabel("scored trajectories per minute")
        ax.set_title(f"Scored trajectories per minute over time ({width:.0f} s bins)")
        ax.set_ylim(bottom=0)
        _save(plt, fig, run_dir / "trajectories_per_minute.png", caption)
        out.append(("trajectories_per_minute.png", "Trajectories per minute over time"))
    stats = [r for r in load["stats"] if r.get("Name") in ("lease", "reset", "step", "evaluate", "release")]
    if stats:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = [r["Name"] for r in stats]
        for q, colour in (("50%", "#3f6fbf"), ("95%", "#bf8f3f"), ("99%", "#bf4f3f")):
            ax.scatter(names, [float(r[q]) / 1000 for r in stats], label=f"p{q[:-1]}", color=colour, s=60)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title("Request latency through the host agent API (Locust)")
        ax.legend()
        _save(plt, fig, run_dir / "request_latency.png", caption)
        out.append(("request_latency.png", "Step, reset and evaluate latency percentiles"))
    summary = trajectory_summary(traj) if traj else {}
    counters = load["samples"][-1].get("counters", {}) if load["samples"] else {}
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
    _save(plt, fig, run_dir / "aborts_recoveries.png", caption)
    out.append(("aborts_recoveries.png", "Aborts and recoveries"))
    if load["samples"]:
        t0 = load["samples"][0]["time"]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = [(x["time"] - t0) / 60 for x in load["samples"]]
        ax.plot(xs, [x["disk_allocated_bytes"]["overlays"] / 2**20 for x in load["samples"]], label="overlays (MiB)")
        ax2 = ax.twinx()
        ax2.plot(
            xs,
            [x["replicas"].get("ready", 0) + x["replicas"].get("leased", 0) for x in load["samples"]],
            color="#bf4f3f",
            label="replicas ready or leased",
        )
        ax.set_xlabel("minutes into the run")
        ax.set_ylabel("overlay MiB (allocated)")
        ax2.set_ylabel("replicas")
        ax.set_title("Disk use and replicas under load (sampled from the host agent)")
        _save(plt, fig, run_dir / "disk_under_load.png", caption)
        out.append(("disk_under_load.png", "Disk use and replicas under load"))
    return out


def _load_markdown(load: dict[str, Any], rows: list[tuple[str, str, str]]) -> list[str]:
    md = ["## Load test (Locust)", ""]
    if load["bringup"]:
        b = load["bringup"][-1]
        md.append(
            f"Bring-up: {b['ready']}/{b['requested']} replicas requested at once were ready"
            + (f", all after {b['all_ready_seconds']:.1f} s (measured here)." if b["all_ready_seconds"] else ".")
        )
        if b["all_ready_seconds"]:
            rows.append(
                (f"bring-up of {b['requested']} replicas at once", f"{b['all_ready_seconds']:.1f} s", "measured here")
            )
    if load["trajectories"]:
        s = trajectory_summary(load["trajectories"])
        md.append(
            f"Trajectories: {s['scored']} scored ({s['successful']} successful, mean reward {s['mean_reward']:.2f}), "
            f"{s['aborted']} unscored aborts, {s['errors']} errors; {s['per_minute']:.1f} per minute (measured here)."
        )
        rows += [
            ("trajectories per minute", f"{s['per_minute']:.1f}", "measured here"),
            ("unscored aborts", f"{s['abort_share'] * 100:.1f}%", "measured here"),
        ]
    for r in load["stats"]:
        if r.get("Name") in ("reset", "step", "evaluate"):
            rows.append(
                (
                    f"API {r['Name']} p50 / p95",
                    f"{float(r['50%']) / 1000:.2f} s / {float(r['95%']) / 1000:.2f} s",
                    "measured here",
                )
            )
    md.append("")
    return md


def _cost(run_dir: Path, resets: dict[str, Any] | None, load: dict[str, Any]) -> list[dict[str, Any]]:
    from osfleet.cost import Footprint, cost_table, load_prices

    samples = [x for x in load["samples"] if x.get("cpu_busy_share") is not None]
    active = [x["replicas"].get("ready", 0) + x["replicas"].get("leased", 0) for x in samples]
    if not samples or not resets or not any(active):
        return []
    cpu = sum(x["cpu_busy_share"] * x["cpus"] for x in samples) / sum(active)
    memory = (resets.get("hold") or {}).get("memory_bytes_per_replica") or resets["snapshot"]["rss_bytes_per_replica"]
    disk = sum(x["disk_allocated_bytes"]["overlays"] for x in samples) / sum(active)
    fp = Footprint(cpu_cores=cpu, memory_bytes=memory, disk_bytes=disk)
    _, hosts = load_prices()
    rows = cost_table(hosts, fp)
    text = f"{cpu:.2f} CPU cores (under the load test), {memory / 2**20:.0f} MiB RAM, {disk / 2**20:.1f} MiB disk"
    for r in rows:
        r["footprint"] = text
    (run_dir / "cost.json").write_text(json.dumps({"footprint": fp.__dict__, "rows": rows}, indent=2) + "\n")
    return rows


def _cost_figure(plt: Any, run_dir: Path, rows: list[dict[str, Any]], load: dict[str, Any]) -> list[tuple[str, str]]:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["host"] for r in rows]
    values = [r["usd_per_replica_day"] or 0 for r in rows]
    bars = ax.barh(names, values, color="#3f6fbf")
    for bar, r in zip(bars, rows, strict=True):
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {r['replicas_per_host']}/host, {r['binding_resource']}-bound",
            va="center",
            fontsize=8,
        )
    ax.axvspan(0.2, 0.3, color="#bf8f3f", alpha=0.2, label="OSGym, published: 0.2-0.3 USD")
    ax.set_xlim(0, max(values + [0.3]) * 1.7)
    ax.set_xlabel("USD per replica-day")
    ax.set_title(
        "Cost per replica-day by host type\n(footprint measured here, prices from osfleet/data/prices.yaml)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower right")
    _save(plt, fig, run_dir / "cost_per_replica_day.png", load["caption"])
    return [("cost_per_replica_day.png", "Cost per replica-day by host type")]


def _comparison(disk: dict[str, Any] | None, resets: dict[str, Any] | None, load: dict[str, Any]) -> list[str]:
    def here(value: str | None) -> str:
        return f"{value} (measured here)" if value else "not measured in this run"

    s = trajectory_summary(load["trajectories"]) if load["trajectories"] else None
    saving = f"{disk['savings_overlay'] * 100:.1f}%" if disk else None
    speedup = f"{disk['speedup_overlay_vs_full']:.0f}x" if disk else None
    reset = f"{seconds(resets['snapshot']['p50'])} (snapshot)" if resets else None
    per_min = f"{s['per_minute']:.1f} on this 2-core host" if s else None
    aborts = f"{s['abort_share'] * 100:.1f}%" if s else None
    return [
        f"| disk saving vs full copies | {here(saving)} | 88% (published) | - |",
        f"| provisioning speed-up vs full copy | {here(speedup)} | 37x (published) | - |",
        f"| reset p50 | {here(reset)} | cold boot per reset (published code) | 37.2 s (published) |",
        f"| trajectories per minute | {here(per_min)} | 1420 at 1024 replicas (published) | - |",
        f"| unscored aborts | {here(aborts)} | - | 1.9% (published) |",
    ]


def _save(plt: Any, fig: Any, path: Path, caption: str) -> None:
    """Every figure carries its caption (machine, accelerator, date, command) and is closed after saving."""
    fig.text(0.01, 0.01, caption, fontsize=6)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
