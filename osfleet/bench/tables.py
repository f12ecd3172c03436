"""Plain-text tables of benchmark results for people; JSON stays the machine-readable form."""

from __future__ import annotations

from typing import Any


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def seconds(s: float) -> str:
    return f"{s * 1000:.2f} ms" if s < 1 else f"{s:.2f} s"


def disk_table(r: dict[str, Any]) -> str:
    n = r["replicas"]
    golden = f"{human_bytes(r['golden_allocated_bytes'])} allocated, {human_bytes(r['golden_virtual_bytes'])} virtual"
    header = ("strategy", "made", "median/replica", "p95/replica", "allocated total", "savings")
    lines = [
        f"disk bench: {n} replicas of {r['image']} (golden {golden})",
        f"{header[0]:<9} {header[1]:>5} {header[2]:>15} {header[3]:>12} {header[4]:>16} {header[5]:>8}",
    ]
    for name in ("overlay", "reflink", "full"):
        s = r["strategies"].get(name, {})
        if not s.get("available"):
            lines.append(f"{name:<9} unavailable: {s.get('reason', '?')}")
            continue
        lines.append(
            f"{name:<9} {s['replicas_made']:>5} {seconds(s['seconds_per_replica_median']):>15} "
            f"{seconds(s['seconds_per_replica_p95']):>12} {human_bytes(s['allocated_bytes_total']):>16} "
            f"{s['savings_vs_full_copies'] * 100:>7.1f}%"
        )
    full = r["strategies"]["full"]
    if full.get("sampled"):
        lines.append(f"note: full copy: {full['note']}")
    lines.append(
        f"overlay speed-up vs full copy: {r['speedup_overlay_vs_full']:.0f}x; "
        f"overlay savings vs {n} full copies: {r['savings_overlay'] * 100:.1f}%"
    )
    if "speedup_reflink_vs_full" in r:
        lines.append(f"reflink speed-up vs full copy: {r['speedup_reflink_vs_full']:.0f}x")
    if "boot" in r:
        b = r["boot"]
        median = human_bytes(b["overlay_allocated_bytes_median"])
        lines.append(
            f"after booting {b['replicas_booted']} overlay replica(s): overlay median {median}, "
            f"savings {b.get('savings_overlay_after_boot', 0) * 100:.1f}%"
        )
    return "\n".join(lines)
