"""The ``k8s`` stack end to end on a real cluster on this machine: the cluster's tools built from the registries
(``scripts/build-k8s``, once per machine), ``osfleet lab k8s up`` (a real control plane, this machine as a real
node, two kwok nodes), the osfleet container image built by code and imported, then ``osfleet bench k8s-faults``:
``pulumi up`` with the real engine and provider, episodes through ``fleetUrl``, and the three failures Kubernetes
causes (the agent pod deleted, a gateway pod killed, the node drained), each recovered from as the contract says,
and ``destroy``. ``lab k8s down`` must then leave nothing of the cluster behind.

In the ``heavy`` tier, beside the OSWorld harness test: on a machine whose tool cache is warm it takes ~10 minutes,
but a first run builds Kubernetes, containerd, etcd, CoreDNS, kwok and the pulumi-kubernetes provider from source,
which a fresh CI machine's 80-minute budget cannot hold beside the rest (measured: the closing note of issue 31
and docs/benchmarks). ``pytest -m heavy`` runs it, or ``pytest -m heavy tests/test_k8s_e2e.py`` alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.config import Settings
from osfleet.lab.kube.cluster import leftovers
from osfleet.lab.kube.state import lab_root, load

pytestmark = [pytest.mark.vm, pytest.mark.heavy]  # ~10 min with the tools built: out of CI's slow run (.ci/run)
REPO = Path(__file__).resolve().parent.parent
OSFLEET = [sys.executable, "-m", "osfleet"]


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """A command of the project, its output kept for the assertion message (the last lines say what failed)."""
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=timeout, env=os.environ.copy())


def tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-3000:]


@pytest.fixture(scope="module")
def lab() -> Iterator[Path]:
    root = lab_root(Settings.from_env())
    state = load(root) if root.exists() else None
    if state is not None:
        pytest.skip(f"a k8s lab is up on this machine ({root}): 'osfleet lab k8s down' first")
    built = run([str(REPO / "scripts" / "build-k8s"), "all"], timeout=3 * 3600)  # a cache hit once built
    assert built.returncode == 0, tail(built)
    up = run([*OSFLEET, "lab", "k8s", "up", "--kwok-nodes", "2"], timeout=600)
    try:
        assert up.returncode == 0, tail(up)
        yield root
    finally:
        down = run([*OSFLEET, "lab", "k8s", "down"], timeout=600)
        assert down.returncode == 0, tail(down)
        assert leftovers(root) == dict.fromkeys(("processes", "namespaces", "links", "mounts", "cgroups", "files"), 0)


def test_the_k8s_stack_recovers_from_what_kubernetes_does_to_it(lab: Path, tmp_path: Path) -> None:
    image = run([*OSFLEET, "image", "container"], timeout=1800)
    assert image.returncode == 0, tail(image)
    reference = image.stdout.strip().splitlines()[-1]
    assert ":" in reference and " " not in reference  # the image reference is the last line, alone

    out = tmp_path / "faults.json"
    bench = run([*OSFLEET, "bench", "k8s-faults", "--timeout", "300", "--json", "--out", str(out)], timeout=3600)
    assert out.exists(), tail(bench)
    result = json.loads(out.read_text())
    assert result["image"] == reference
    agent, gateway, drained = result["agent_pod_deleted"], result["gateway_pod_killed"], result["node_drained"]

    # The agent's new pod adopts the node's replicas: the lease held across its restart answers again, and
    # during the restart it got infrastructure failures (503), nothing else.
    assert "held_lease_back_seconds" in agent, agent
    assert set(agent["held_lease_errors"]) <= {"InfrastructureError 503"}, agent
    assert agent["episode_reward"] == 0.0  # the task is not done by one wait: scored, not failed

    # One gateway killed: the Service moves to the other; a few calls may fail while it does, never for long.
    assert "pod_ready_again_seconds" in gateway, gateway
    for probe in (gateway["sdk"], gateway["fresh_connections"]):
        assert probe["longest_without_answer_seconds"] < 30, gateway
        assert probe["failed"] < probe["calls"] / 4, gateway

    # The node drained: the held lease ends as an infrastructure failure naming the node, never as a reward.
    assert "held_lease_ended_seconds" in drained, drained
    assert drained["evaluate_answer"].startswith("InfrastructureError 503"), drained
    assert drained["node"] in drained["held_lease_answer"], drained
    assert not drained["new_lease_answer"].startswith("leased"), drained
    assert drained["episode_reward"] == 0.0

    assert result["ok"] is True and bench.returncode == 0, tail(bench)
    assert result["destroy_seconds"] is not None
    assert result["replica_domains_after_destroy"] == 0  # an uninstall takes the node's replicas with it
