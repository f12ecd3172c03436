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
    if disk is None and boot is None:
        raise OsfleetError(f"{run_dir} holds no results (disk.json, boot.json): run 'osfleet bench all' first")
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
