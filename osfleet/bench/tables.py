"""Plain-text tables of benchmark results for people; JSON stays the machine-readable form."""

from __future__ import annotations

from typing import Any

from osfleet.measure.stats import human_bytes as human_bytes  # shared with the report, so in osfleet.measure.stats
from osfleet.measure.stats import seconds as seconds


def disk_table(r: dict[str, Any]) -> str:
    n = r["replicas"]
    golden = f"{human_bytes(r['golden_allocated_bytes'])} allocated, {human_bytes(r['golden_virtual_bytes'])} virtual"
    header = ("strategy", "made", "p50/replica", "p95/replica", "allocated total", "savings")
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
            f"{name:<9} {s['replicas_made']:>5} {seconds(s['seconds_per_replica_p50']):>15} "
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
        p50 = human_bytes(b["overlay_allocated_bytes_p50"])
        lines.append(
            f"after booting {b['replicas_booted']} overlay replica(s): overlay p50 {p50}, "
            f"savings {b.get('savings_overlay_after_boot', 0) * 100:.1f}%"
        )
    return "\n".join(lines)


def reset_table(r: dict[str, Any]) -> str:
    accel = {"kvm": "KVM", "qemu": "TCG"}.get(r.get("accelerator", ""), "?")
    size = f"{r['replicas']} replicas x {r['resets_per_replica']} resets per mode"
    cold_rounds = r.get("cold", {}).get("rounds")
    if cold_rounds is not None and cold_rounds < r["resets_per_replica"]:
        size += f" ({cold_rounds} cold: its rounds passed --cold-budget)"
    lines = [
        f"reset bench: {size}, {r['image']} under {accel}",
        f"{'mode':<9} {'reset p50':>10} {'reset p95':>10} {'bring-up p50':>13} {'RSS/replica':>12}",
    ]
    for mode in ("cold", "snapshot"):
        m = r[mode]
        lines.append(
            f"{mode:<9} {seconds(m['p50']):>10} {seconds(m['p95']):>10} {seconds(m['bringup_seconds']['p50']):>13} "
            f"{human_bytes(m['rss_bytes_per_replica']):>12}"
        )
    lines.append(f"snapshot reset is {r['speedup_snapshot_vs_cold']:.1f}x faster than cold (p50)")
    lat = r.get("latency", {})
    parts = [f"{k.removesuffix('_seconds').replace('_', ' ')} p50 {seconds(v['p50'])}" for k, v in lat.items()]
    if parts:
        lines.append("latency: " + ", ".join(parts))
    if "hold" in r:
        h = r["hold"]
        lines.append(
            f"held {h['held_ready']} replicas ready at once ({h['stop_reason']}); "
            f"{human_bytes(h['memory_bytes_per_replica'])} host memory per replica"
        )
    return "\n".join(lines)


def fork_table(result: dict[str, Any]) -> str:
    """One paragraph: children ready, per-child timings, the checks, leaks."""
    return (
        f"{result['children_ready']}/{result['children']} children ready ({result['memory_mode']} memory): "
        f"p50 {result['fork_p50_s']:.2f} s, p95 {result['fork_p95_s']:.2f} s per child; parent saved in "
        f"{result['save_s']:.2f} s (paused {result['parent_paused_s']:.2f} s), all ready in {result['total_s']:.2f} s; "
        f"same state {result['same_state']}, diverged {result['diverged']}, nested {result['nested_fork_ok']}, "
        f"leaks {sum(result['leaks'].values())}"
    )


def density_table(result: dict[str, Any]) -> str:
    """One line per run (sharing on, and off with --compare)."""
    lines = []
    for label, r in [("sharing on", result), ("sharing off", result.get("sharing_off"))]:
        if r:
            cpu = (r["cpu_per_idle_replica"] or 0) * 100
            lines.append(
                f"{label}: {r['held_ready']} held ({'parked' if r.get('parked') else 'running'}), {r['answering']} "
                f"answering, {r['mib_per_replica'] or 0:.0f} MiB and {cpu:.1f} % of a core (running idle) each, "
                f"bring-up p50 {r['bringup_p50_s'] or 0:.2f} s ({r['stop_reason']})"
            )
    return "\n".join(lines)
