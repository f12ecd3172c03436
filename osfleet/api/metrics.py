"""Prometheus metrics of one host agent: replicas by state, latencies, failures by kind, disk bytes."""

from __future__ import annotations

from pathlib import Path

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

    def render(self, host: ReplicaHost) -> bytes:
        counts = {s.value: 0 for s in State}
        for rec in host.replicas():
            counts[rec.state.value] += 1
        for state, n in counts.items():
            self.replicas.labels(state=state).set(n)
        self.disk.labels(kind="golden").set(qcow2.allocated_bytes(host.image.disk))
        overlays = sum(qcow2.allocated_bytes(p) for p in host.settings.replicas_dir.glob("r-*/*.qcow2"))
        self.disk.labels(kind="overlays").set(overlays)
        self.disk.labels(kind="saved_states").set(_tree_bytes(host.settings.states_dir))
        return bytes(generate_latest(self.registry))


def _tree_bytes(root: Path) -> int:
    return sum(qcow2.allocated_bytes(p) for p in root.rglob("*") if p.is_file()) if root.exists() else 0
