"""The chaos bench's audit, on hand-made runs: which aborts a fault explains, when a target served again,
which acknowledged steps the hosts' audit logs lack or hold twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osfleet.bench import chaos as bench
from osfleet.chaos.faults import Fault

pytestmark = pytest.mark.unit


def fault(kind: str, host: str, replica: str | None, at: float, healed: float | None = None) -> Fault:
    return Fault(
        id=f"{kind}-{at}",
        kind=kind,  # type: ignore[arg-type]
        host=host,
        replica=replica,
        target=f"{host}/{replica}" if replica else host,
        injected_at=at,
        mechanism="test",
        did="test",
        healed_at=healed,
    )


def episode(replica: str, start: float, end: float) -> dict[str, object]:
    return {"replica": replica, "t_start": start, "t_end": end, "status": "aborted"}


def test_an_abort_is_explained_only_by_a_fault_on_its_replica_or_its_host() -> None:
    faults = [fault("kill_qemu", "h1", "r-a", 100.0), fault("kill_host_agent", "h2", None, 200.0)]
    assert bench._touched(episode("h1.r-a", 90, 105), faults)
    assert not bench._touched(episode("h1.r-b", 90, 105), faults)  # same host, other replica: collateral
    assert bench._touched(episode("h2.r-c", 190, 210), faults)  # host-wide fault
    assert not bench._touched(episode("h2.r-c", 10, 20), faults)  # long before it
    assert not bench._touched(episode("h1.r-a", 100 + bench.RECOVERY_GRACE_SECONDS + 1, 400), faults)


def test_a_replica_fault_is_recovered_when_a_later_generation_serves() -> None:
    f = fault("kill_qemu", "h1", "r-a", 100.0)
    samples = [
        {"time": 99.0, "hosts": {"h1": True}, "replicas": [{"id": "h1.r-a", "state": "leased", "generation": 3}]},
        {"time": 101.0, "hosts": {"h1": True}, "replicas": [{"id": "h1.r-a", "state": "failed", "generation": 3}]},
        {"time": 103.0, "hosts": {"h1": True}, "replicas": [{"id": "h1.r-a", "state": "ready", "generation": 3}]},
        {"time": 109.0, "hosts": {"h1": True}, "replicas": [{"id": "h1.r-a", "state": "ready", "generation": 4}]},
    ]
    assert bench._recovered_at(f, samples) == 109.0
    assert bench._layer(f, samples) == "rebuild"
    host_fault = fault("kill_host_agent", "h1", None, 100.0)
    samples[1]["hosts"] = {"h1": False}
    assert bench._recovered_at(host_fault, samples[:2]) is None
    assert bench._recovered_at(host_fault, samples) == 103.0  # healthy again, and none of its replicas failed
    assert bench._layer(host_fault, samples) == "drain"


def test_lost_and_duplicated_steps_come_from_the_hosts_audit_logs(tmp_path: Path) -> None:
    host = bench.BenchHost("h1", 0, tmp_path / "h1", image=None, warm=1)  # type: ignore[arg-type]
    (host.home / "audit").mkdir(parents=True)
    lines = [{"replica": "r-a", "lease": "L", "action_id": a} for a in ("0", "1", "1")]
    (host.home / "audit" / "r-a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    applied = bench._audit_entries([host])
    assert applied[("h1.r-a", "h1.L", "0")] == 1 and applied[("h1.r-a", "h1.L", "1")] == 2
    assert applied[("h1.r-a", "h1.L", "2")] == 0
