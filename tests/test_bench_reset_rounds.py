"""``bench reset``'s cold budget on a stand-in host (no VM): a cold reset of the office image is a full boot of
minutes under TCG, so cold rounds stop once they passed the budget, at least one runs, and the JSON says how
many did. The stand-in is what cannot be a VM here cheaply; the real path runs in test_exit_paths and the
acceptance check."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from osfleet.bench import reset as reset_bench
from osfleet.bench.reset import _mode_run
from osfleet.bench.tables import reset_table

pytestmark = pytest.mark.unit


@dataclass
class _Timed:
    replica: str
    seconds: float


class _StandInHost:
    """The ReplicaHost calls ``_mode_run`` makes, with resets that move a clock by ``reset_s``."""

    def __init__(self, reset_s: float) -> None:
        self.reset_s = reset_s
        self.now = 1000.0
        self.resets = 0
        self.counters = {"bringup_retries": 0}
        self.virt = SimpleNamespace(qemu_pid=lambda domain: None)
        self.generations = SimpleNamespace(domain_name=lambda rid, gen: f"{rid}-g{gen}")

    def create(self, mode: str) -> _Timed:
        self.now += 0.001
        return _Timed(f"r-{self.now}", 0.01)

    def settle(self) -> None:
        pass

    def rss_bytes(self, rid: str) -> int:
        return 1

    def get(self, rid: str) -> Any:
        return SimpleNamespace(domain=rid, generation=1)

    def reset(self, rid: str, mode: str) -> _Timed:
        self.now += self.reset_s
        self.resets += 1
        return _Timed(rid, self.reset_s)


@pytest.mark.parametrize(("budget", "rounds"), [(None, 4), (60.0, 4), (0.05, 1), (0.15, 2)])
def test_cold_rounds_stop_once_past_the_budget(
    budget: float | None, rounds: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _StandInHost(reset_s=0.04)  # a round of two replicas: 0.08 s on its clock
    monkeypatch.setattr(reset_bench, "time", SimpleNamespace(monotonic=lambda: host.now))
    made: list[str] = []
    result = _mode_run(host, "cold", 2, 4, lambda m: None, made, budget)  # type: ignore[arg-type]
    assert result["rounds"] == rounds and host.resets == 2 * rounds == len(result["samples"])
    assert len(made) == 2


def test_the_table_says_when_cold_rounds_were_cut() -> None:
    mode = {"p50": 1.0, "p95": 1.0, "bringup_seconds": {"p50": 1.0}, "rss_bytes_per_replica": 1}
    doc = {
        "image": "golden-x",
        "accelerator": "qemu",
        "replicas": 2,
        "resets_per_replica": 3,
        "cold": {**mode, "rounds": 1},
        "snapshot": {**mode, "rounds": 3},
        "speedup_snapshot_vs_cold": 1.0,
    }
    assert "(1 cold: its rounds passed --cold-budget)" in reset_table(doc)
    doc["cold"]["rounds"] = 3
    assert "cold-budget" not in reset_table(doc)
