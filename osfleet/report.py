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
    if disk is None and boot is None and resets is None:
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
        fig.text(0.01, 0.01, caption, fontsize=6)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.savefig(run_dir / "provisioning_time.png", dpi=110)
        plt.close(fig)
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
        fig.text(0.01, 0.01, caption, fontsize=6)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.savefig(run_dir / "disk_use.png", dpi=110)
        plt.close(fig)
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
        fig.text(0.01, 0.01, caption, fontsize=6)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        fig.savefig(run_dir / "boot.png", dpi=110)
        plt.close(fig)
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

    md += ["## Key figures", "", "| figure | value | source |", "|---|---|---|"]
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
    ax.set_title("Reset latency CDF: cold boot vs saved-state restore")
    ax.legend()
    fig.text(0.01, 0.01, caption, fontsize=6)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(run_dir / "reset_cdf.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    modes = ["cold", "snapshot"]
    ax.bar(modes, [r[m]["bringup_seconds"]["p50"] for m in modes], color=["#bf4f3f", "#2f7f4f"], label="p50")
    ax.scatter(
        modes, [r[m]["bringup_seconds"]["p95"] for m in modes], color="black", marker="_", s=400, label="p95", zorder=3
    )
    ax.set_ylabel("seconds to a ready replica")
    ax.set_title("Bring-up time per replica by mode")
    ax.legend()
    fig.text(0.01, 0.01, caption, fontsize=6)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(run_dir / "bringup.png", dpi=110)
    plt.close(fig)
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
        fig.text(0.01, 0.01, caption, fontsize=6)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(run_dir / "latency.png", dpi=110)
        plt.close(fig)
        out.append(("latency.png", "Observe / act latency"))
    return out
