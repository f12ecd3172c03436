"""``osfleet bench k8s-faults`` without a cluster: how it counts failed calls and times the stretch without an
answer, how it finds one pod's process among its siblings (a folder laid out as /proc is), what it reads of a
pod, its table and its CLI's errors. The faults themselves need a k8s lab: ``tests/test_k8s_e2e.py`` runs them
(the ``heavy`` tier) and docs/benchmarks has the measured page."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from osfleet.bench.k8s_faults import (
    Probe,
    fresh_step,
    is_ready,
    outcome,
    pod_processes,
    ready_pods,
    restarts,
    retry_until,
    summarise,
    table,
)
from osfleet.cli import cli
from osfleet.client.errors import CapacityError, InfrastructureError
from osfleet.errors import OsfleetError
from tests.json_server import json_server

pytestmark = pytest.mark.unit


def test_a_failure_is_named_by_its_kind_and_status() -> None:
    assert outcome(InfrastructureError("host gone")) == "InfrastructureError 503"
    assert outcome(CapacityError("no replica")) == "CapacityError 503"
    assert outcome(ConnectionResetError()) == "ConnectionResetError"


def test_the_longest_stretch_runs_from_the_last_good_answer_to_the_next() -> None:
    calls = [(0.2, None), (0.4, None), (0.6, "InfrastructureError 503"), (0.8, "ConnectError"), (1.3, None),
             (1.5, "InfrastructureError 503"), (1.7, None)]  # fmt: skip
    got = summarise(calls)
    assert got["calls"] == 7 and got["failed"] == 3
    assert got["failures"] == {"InfrastructureError 503": 2, "ConnectError": 1}
    assert got["longest_without_answer_seconds"] == pytest.approx(0.9)  # 0.4 (last good) to 1.3 (next good)
    assert summarise([(0.2, None), (0.4, None)])["longest_without_answer_seconds"] == 0
    never_back = summarise([(0.2, None), (0.4, "X"), (2.0, "X")])  # still failing at the end: up to the last call
    assert never_back["longest_without_answer_seconds"] == pytest.approx(1.8)
    assert summarise([]) == {"calls": 0, "failed": 0, "failures": {}, "longest_without_answer_seconds": 0}


def test_a_probe_records_each_call_until_stopped() -> None:
    made = []

    def call() -> None:  # the 3rd to 5th calls fail: what the probe sees depends on its calls, not on the clock
        made.append(1)
        if 3 <= len(made) <= 5:
            raise InfrastructureError("down")

    probe = Probe(call, interval=0.01)
    probe.start()
    deadline = time.monotonic() + 60
    while len(probe.calls) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    probe.stop()
    kinds = [f for _, f in probe.calls]
    assert kinds[:8] == [None, None] + ["InfrastructureError 503"] * 3 + [None] * 3
    times = [t for t, _ in probe.calls]
    assert times == sorted(times)
    count = len(probe.calls)
    time.sleep(0.05)
    assert len(probe.calls) == count  # stopped means stopped


def test_retry_until_counts_failures_and_gives_up_with_the_last_one() -> None:
    tries = iter([InfrastructureError("a"), CapacityError("b"), 42])
    errors: Counter[str] = Counter()

    def call() -> int:
        got = next(tries)
        if isinstance(got, Exception):
            raise got
        return got

    assert retry_until("thing", call, timeout=30, errors=errors) == 42
    assert errors == {"InfrastructureError 503": 1, "CapacityError 503": 1}

    def never() -> None:
        raise InfrastructureError("host osfleet-node is cordoned")

    with pytest.raises(OsfleetError, match=r"thing: still failing after 1 s \(InfrastructureError 503: .*cordoned"):
        retry_until("thing", never, timeout=1)


def test_a_pods_readiness_and_restarts_are_read_from_its_status() -> None:
    ready = {"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                        "containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]}}  # fmt: skip
    assert is_ready(ready) and restarts(ready) == 3
    leaving = {"metadata": {"deletionTimestamp": "2026-12-05T00:00:00Z"}, "status": ready["status"]}
    assert not is_ready(leaving)  # a pod shutting down is not where calls should go
    assert not is_ready({"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert restarts({"status": {}}) == 0


def test_only_the_named_pods_process_is_found(tmp_path: Path) -> None:
    def process(pid: int, cgroup: str, args: bytes = b"/venv/bin/python\0/venv/bin/osfleet\0fleet\0serve\0") -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(args)
        (d / "cgroup").write_text(cgroup)

    uid = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
    process(101, f"4:memory:/kubepods/besteffort/pod{uid}/abc123\n")
    process(102, "4:memory:/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/def456\n")  # its sibling
    process(103, "4:memory:/user.slice\n")  # a gateway of this machine's own, outside the cluster
    process(104, f"4:memory:/kubepods/besteffort/pod{uid}/abc123\n", b"/pause\0")  # same pod, not the gateway
    process(105, f"4:memory:/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/x\n")  # systemd's naming
    assert pod_processes(uid, ("osfleet", "fleet", "serve"), tmp_path) == [101, 105]


def test_the_table_names_each_fault_and_what_the_held_lease_got() -> None:
    result = {
        "agent_pod_deleted": {"new_pod_ready_seconds": 8.1, "held_lease_back_seconds": 12.0,
                              "episode_again_seconds": 14.5, "held_lease_errors": {"InfrastructureError 503": 9}},
        "gateway_pod_killed": {"pod_ready_again_seconds": 5.0,
                               "sdk": {"calls": 90, "failed": 0, "failures": {},
                                       "longest_without_answer_seconds": 0.0},
                               "fresh_connections": {"calls": 88, "failed": 2,
                                                     "failures": {"ConnectionRefusedError": 2},
                                                     "longest_without_answer_seconds": 0.6}},
        "node_drained": {"held_lease_ended_seconds": 2.5, "episode_again_seconds": 4.0,
                         "evaluate_answer": "InfrastructureError 503: node osfleet-node is cordoned or drained"},
        "destroy_seconds": 16.3, "replica_domains_after_destroy": 0,
    }  # fmt: skip
    lines = table(result).splitlines()
    assert len(lines) == 6
    assert lines[5] == "| `pulumi destroy` | 16.3 s | 0 replica domain(s) left on the node |"
    assert "held lease answers again 12.0 s" in lines[2] and "InfrastructureError 503 x9" in lines[2]
    assert "SDK: 0 of 90 calls failed, 0.0 s without; a connection per call: 2 of 88 calls failed, 0.6 s" in lines[3]
    assert "ConnectionRefusedError x2" in lines[3]
    assert "evaluate: InfrastructureError 503" in lines[4]
    result["agent_pod_deleted"].pop("held_lease_back_seconds")
    assert "held lease answers again never" in table(result)


def test_a_fresh_connection_step_names_what_failed() -> None:
    status = [200]
    ctx = ssl.create_default_context()
    with json_server(lambda _request: (status[0], {"reason": "no"})) as (url, seen):
        fresh_step(url, "t", ctx, "node-1.r-1", "lease-1")
        asked = seen[-1]
        assert (asked.method, asked.path) == ("POST", "/v1/replicas/node-1.r-1/step")
        assert asked.headers["Authorization"] == "Bearer t"
        assert asked.body["lease_id"] == "lease-1" and asked.body["actions"] == [{"type": "wait", "seconds": 0}]
        assert asked.body["observe"] is False and len(asked.body["action_id"]) == 32
        status[0] = 503
        with pytest.raises(urllib.error.HTTPError) as answered:
            fresh_step(url, "t", ctx, "node-1.r-1", "lease-1")
        assert outcome(answered.value) == "HTTPError 503"
    with pytest.raises(ConnectionRefusedError) as refused:  # nothing listens there now
        fresh_step(url, "t", ctx, "node-1.r-1", "lease-1")
    assert outcome(refused.value) == "ConnectionRefusedError"


def test_without_a_lab_the_command_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))
    out = CliRunner().invoke(cli, ["bench", "k8s-faults"])
    assert out.exit_code != 0
    assert out.output.strip().splitlines()[-1] == "osfleet: error: no k8s lab is up: osfleet lab k8s up"
    bad = CliRunner().invoke(cli, ["bench", "k8s-faults", "--timeout", "5"])
    assert bad.exit_code != 0 and "30<=x<=3600" in bad.output


def test_a_fault_waits_for_its_pods_to_be_ready_and_says_so() -> None:
    """After the agent pod's deletion the gateways may be out of their Service for a probe period or two: the next
    fault waits for both (as CI once saw: 0 Ready when the gateway fault began), and gives up with the count."""

    def pod(uid: str, ready: bool) -> dict[str, Any]:
        return {"metadata": {"uid": uid}, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}

    answers = iter(
        [[pod("a", False), pod("b", False)], [pod("a", True), pod("b", False)], [pod("a", True), pod("b", True)]]
    )
    asked: list[list[str]] = []

    def kubectl(args: list[str], **_: Any) -> str:
        asked.append(args)
        return json.dumps({"items": next(answers)})

    said: list[str] = []
    ready = ready_pods(kubectl, "app=g", 2, 30, said.append, "gateway")
    assert [p["metadata"]["uid"] for p in ready] == ["a", "b"] and len(asked) == 3
    assert said == ["  waiting for 2 Ready gateway pods (0 now, at most 30 s)"]  # once, not per poll
    never = lambda args, **_: json.dumps({"items": [pod("a", True)]})  # noqa: E731
    with pytest.raises(OsfleetError, match=r"^1 Ready gateway pod\(s\) after 0 s; the stack runs 2$"):
        ready_pods(never, "app=g", 2, 0, said.append, "gateway")
