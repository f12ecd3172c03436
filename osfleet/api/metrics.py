"""Prometheus metrics of one host agent: replicas by state, latencies, failures by kind, disk bytes."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from osfleet.api.admission import Ledger
from osfleet.api.host import AgentHost
from osfleet.replicas.records import State
from osfleet.vm import qcow2

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
        # The recovery layers acted on this host: 1 a step retried by its action id (replayed), 2 a reset,
        # 3 a rebuild of a failed replica (detected failures and recoveries).
        self.replays = Counter("osfleet_step_replays_total", "Steps retried by action id", registry=self.registry)
        self.events = Gauge("osfleet_replica_events", "Replica events since start", ["event"], registry=self.registry)
        self.forks = Gauge("osfleet_fork_states", "Saved forks still used by a replica", registry=self.registry)
        self.fork_children = Gauge(
            "osfleet_fork_children", "Replicas using a saved fork (sum of reference counts)", registry=self.registry
        )
        self.fork_bytes = Gauge("osfleet_fork_bytes", "Saved forks' bytes", ["kind"], registry=self.registry)
        self.client_use = Gauge(
            "osfleet_client_in_use",
            "What each client holds of its fair share now (osfleet.api.admission): requests in flight, bytes of "
            "bodies they declared, evaluations under way, bytes of forks and checkpoints being saved",
            ["client", "resource"],
            registry=self.registry,
        )

    def failure(self, kind: str) -> None:
        self.failures.labels(kind=kind).inc()

    def sample(self, host: AgentHost) -> dict[str, Any]:
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
            "forks": _tree_bytes(host.settings.forks_dir),
        }
        for kind, n in disk.items():
            self.disk.labels(kind=kind).set(n)
        counters = host.counters.snapshot()
        for event, n in counters.items():
            self.events.labels(event=event).set(n)
        forks = host.fork_states()
        self.forks.set(len(forks))
        self.fork_children.set(sum(f.children for f in forks))
        self.fork_bytes.labels(kind="disk").set(sum(f.disk_bytes for f in forks))
        self.fork_bytes.labels(kind="memory").set(sum(f.memory_bytes for f in forks))
        return {
            "replicas": counts,
            "forks": [asdict(f) for f in forks],
            "disk_allocated_bytes": disk,
            "counters": counters,
            "capacity": capacity(host, counts),
        }

    def shares(self, ledger: Ledger) -> None:
        """Each client's use of its fair share (clients that hold nothing now are not listed)."""
        self.client_use.clear()
        for resource, counts in ledger.snapshot().items():
            for client, n in counts.items():
                self.client_use.labels(client=client, resource=resource).set(n)

    def render(self, host: AgentHost, ledger: Ledger | None = None) -> bytes:
        self.sample(host)
        if ledger is not None:
            self.shares(ledger)
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


def capacity(host: AgentHost, counts: dict[str, int]) -> dict[str, Any]:
    """What a gateway places by: the host's maximum and the measured memory of its running replicas."""
    running = [r for r in host.replicas() if r.state in (State.READY, State.LEASED)]
    rss = [b for b in (host.rss_bytes(r.id) for r in running) if b]
    return {
        "max_replicas": host.max_replicas,
        "replicas": sum(n for state, n in counts.items() if state != State.RETIRED.value),
        "rss_bytes_per_replica": sum(rss) / len(rss) if rss else None,
    }
