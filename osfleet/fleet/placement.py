"""Where leases and new replicas go: by each host's measured capacity, packing on its binding resource.

A host's room is the number of replicas it can still take on its scarcest resource: its configured
maximum, memory (free memory over the measured memory per replica) and CPU (idle cores over the CPU per
replica). New replicas go to the host whose room fits the request most tightly (best fit), so large hosts
stay free for large requests; leases go to the fullest host that has a ready replica, which keeps idle
hosts idle. Round-robin would spread load and leave every host half used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_REPLICA_BYTES = 350 * 2**20
HOST_RESERVE_BYTES = 2 * 2**30
CPU_PER_IDLE_REPLICA = 0.02  # cores; idle desktops under TCG, measured (notes: ~1.7 % of a core each)


@dataclass(frozen=True)
class Room:
    host: str
    replicas: int  # replicas the host can still take
    binding: str  # max_replicas | memory | cpu
    ready: int  # ready (unleased) replicas now
    used_share: float  # how full the host is on its binding resource, 0..1


def room(host: str, sample: dict[str, Any]) -> Room:
    """The room of a host from its ``/v1/host`` sample."""
    cap = sample.get("capacity") or {}
    states = sample.get("replicas") or {}
    have = int(cap.get("replicas") or 0)
    by: dict[str, int] = {"max_replicas": int(cap.get("max_replicas") or 0) - have}
    per = float(cap.get("rss_bytes_per_replica") or DEFAULT_REPLICA_BYTES)
    total, used = sample.get("memory_total_bytes"), sample.get("memory_used_bytes")
    if total and used is not None:
        by["memory"] = int((total - used - HOST_RESERVE_BYTES) // per)
    cpus, busy = sample.get("cpus"), sample.get("cpu_busy_share")
    if cpus and busy is not None:
        reserve = max(0.25, 0.1 * cpus)  # cores kept for the host itself
        by["cpu"] = int((cpus * (1.0 - busy) - reserve) / CPU_PER_IDLE_REPLICA)
    binding = min(by, key=lambda k: by[k])
    left = max(0, by[binding])
    capacity = have + left
    return Room(
        host=host,
        replicas=left,
        binding=binding,
        ready=int(states.get("ready") or 0),
        used_share=have / capacity if capacity else 1.0,
    )


def fullest_first(rooms: list[Room]) -> list[str]:
    """Hosts, the fullest on its binding resource first (the order leases try them in)."""
    return [r.host for r in sorted(rooms, key=lambda r: (-r.used_share, r.host))]


def lease_order(rooms: list[Room]) -> list[str]:
    """Hosts to try for a lease: those with a ready replica, fullest first."""
    return fullest_first([r for r in rooms if r.ready > 0])


def scale_plan(rooms: list[Room], count: int) -> dict[str, int]:
    """How many new replicas each host gets: best fit for the whole request, else the roomiest first."""
    fits = sorted((r for r in rooms if r.replicas >= count), key=lambda r: (r.replicas, r.host))
    if fits:
        return {fits[0].host: count}
    plan: dict[str, int] = {}
    left = count
    for r in sorted(rooms, key=lambda r: (-r.replicas, r.host)):
        if left == 0:
            break
        take = min(left, r.replicas)
        if take > 0:
            plan[r.host] = take
            left -= take
    return plan if left == 0 else {}
