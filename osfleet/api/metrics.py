"""Prometheus metrics of one host agent: replicas by state, latencies, failures by kind, disk bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from osfleet import qcow2
from osfleet.replicas.manager import ReplicaHost
from osfleet.replicas.records import State

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.replicas = Gauge("osfleet_replicas", "Replicas by state", ["state"], registry=self.registry)
        self.reset = Histogram(
            "osfleet_reset_seconds", "Reset (to a task) latency", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.step = Histogram("osfleet_step_seconds", "Step latency", buckets=LATENCY_BUCKETS, registry=self.registry)
        self.evaluate = Histogram(
            "osfleet_evaluate_seconds", "Evaluate latency", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.failures = Counter("osfleet_failures_total", "Failed requests by kind", ["kind"], registry=self.registry)
        self.disk = Gauge("osfleet_disk_allocated_bytes", "Allocated bytes on disk", ["kind"], registry=self.registry)

    def failure(self, kind: str) -> None:
        self.failures.labels(kind=kind).inc()

    def sample(self, host: ReplicaHost) -> dict[str, Any]:
        """Replicas by state and allocated disk bytes; also sets the gauges."""
        counts = {s.value: 0 for s in State}
        for rec in host.replicas():
            counts[rec.state.value] += 1
        for state, n in counts.items():
            self.replicas.labels(state=state).set(n)
        disk = {
            "golden": qcow2.allocated_bytes(host.image.disk),
            "overlays": sum(qcow2.allocated_bytes(p) for p in host.settings.replicas_dir.glob("r-*/*.qcow2")),
            "saved_states": _tree_bytes(host.settings.states_dir),
        }
        for kind, n in disk.items():
            self.disk.labels(kind=kind).set(n)
        return {"replicas": counts, "disk_allocated_bytes": disk, "counters": host.counters.snapshot()}

    def render(self, host: ReplicaHost) -> bytes:
        self.sample(host)
        return bytes(generate_latest(self.registry))


def _tree_bytes(root: Path) -> int:
    return sum(qcow2.allocated_bytes(p) for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def host_usage() -> dict[str, Any]:
    """Host CPU busy share since the previous call (0 on the first), and memory in use."""
    busy = psutil.cpu_percent(interval=None)
    mem = psutil.virtual_memory()
    return {
        "cpu_busy_share": busy / 100.0,
        "cpus": psutil.cpu_count(),
        "memory_total_bytes": mem.total,
        "memory_used_bytes": mem.total - mem.available,
    }
