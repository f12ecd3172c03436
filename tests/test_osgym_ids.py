"""OSGym vm ids through gateways: the same id names the same replica whichever gateway pod it reaches.

Two gateways over the same two host agents, listed in opposite orders (two pods of the k8s Deployment, or one
restarted whose discovery found the hosts in another order): a vm id from the first once stepped a different
replica through the second, and others answered 404. The host agents here are real (uvicorn on loopback) over the
API's fake host (no VM).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.errors import NotFound
from osfleet.fleet import ids
from osfleet.fleet.app import create_gateway
from osfleet.replicas.episodes import OSGYM_VM_IDS
from tests.fakes import FakeHost
from tests.test_fleet import TASK, TOKEN, Agent, free_port, rooms_known

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[dict[str, Agent]]:
    made = {n: Agent(n, FakeHost(tmp_path / n, ready=2, max_replicas=4), free_port()) for n in ("kvm-a", "kvm-b")}
    for a in made.values():
        a.start()
    yield made
    for a in made.values():
        a.stop()


@pytest.mark.system  # the host agents start their evaluation jail
def test_a_vm_id_from_one_gateway_steps_the_same_replica_through_another(two_hosts: dict[str, Agent]) -> None:
    forward = [two_hosts["kvm-a"].entry, two_hosts["kvm-b"].entry]
    with (
        TestClient(create_gateway(TOKEN, forward, osgym_allowed_ips=())) as first,
        TestClient(create_gateway(TOKEN, forward[::-1], osgym_allowed_ips=())) as second,
    ):
        rooms_known(first)
        rooms_known(second)
        vms = []
        for _ in range(4):  # every replica of both hosts: vm ids of each host
            r = first.post("/reset", json={"task_config": TASK, "timeout": 600}, headers=AUTH)
            assert r.status_code == 200, r.text
            vms.append(r.json()["vm_id"])
        for vm in vms:
            through_first = stepped_on(two_hosts, first, vm)  # the host the vm's own gateway steps
            assert stepped_on(two_hosts, second, vm) == through_first  # the other gateway: the same host
            assert second.get("/screenshot", params={"vmId": vm}, headers=AUTH).json()["vm_id"] == vm
            assert second.post("/shutdown", json={"vm_id": vm}, headers=AUTH).status_code == 200
            assert first.post("/step", json={"action": "WAIT", "vm_id": vm}, headers=AUTH).status_code == 404
        assert {h: len(a.host.applied) for h, a in two_hosts.items()} == {"kvm-a": 4, "kvm-b": 4}


def stepped_on(hosts: dict[str, Agent], gateway: TestClient, vm: int) -> str:
    """Step ``vm`` through ``gateway``; the host whose fake guest got the step."""
    before = {name: len(a.host.applied) for name, a in hosts.items()}
    r = gateway.post("/step", json={"action": "click(3,4)", "vm_id": vm}, headers=AUTH)
    assert r.status_code == 200, r.text
    (host,) = [name for name, a in hosts.items() if len(a.host.applied) == before[name] + 1]
    return host


@pytest.mark.unit
def test_a_vm_id_carries_a_key_of_the_hosts_name_and_stays_exact_in_json() -> None:
    key = ids.host_key("kvm-a")
    assert key == ids.host_key("kvm-a") and key != ids.host_key("kvm-b")
    fleet_vm = ids.vm_to_fleet("kvm-a", 17)
    assert ids.vm_from_fleet(fleet_vm) == (key, 17)
    assert ids.vm_to_fleet("kvm-a", OSGYM_VM_IDS - 1) < 2**53  # a double holds it exactly
    with pytest.raises(ValueError, match="host kvm-a gave vm id 1000000, outside 0..999999"):
        ids.vm_to_fleet("kvm-a", OSGYM_VM_IDS)  # would name another host's vm
    for bad in (-1, 2**53):
        with pytest.raises(NotFound, match=f"vm {bad} is not allocated to this client"):
            ids.vm_from_fleet(bad)


@pytest.mark.system
def test_two_hosts_whose_names_give_one_key_serve_no_osgym_vm(
    two_hosts: dict[str, Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hash collision between two host names (about 1 in 10**10 per pair): both count their vm ids from 0, so a
    vm id could name either; no vm is handed out on them and a vm id of theirs is refused, saying why."""
    from osfleet.fleet import hosts

    monkeypatch.setattr(hosts, "host_key", lambda name: 7)
    monkeypatch.setattr(ids, "host_key", lambda name: 7)
    entries = [a.entry for a in two_hosts.values()]
    with TestClient(create_gateway(TOKEN, entries, osgym_allowed_ips=())) as gw:
        rooms_known(gw)
        r = gw.post("/reset", json={"task_config": TASK, "timeout": 600}, headers=AUTH)
        assert r.status_code == 503 and r.json()["kind"] == "capacity", r.text
        r = gw.post("/step", json={"action": "WAIT", "vm_id": 7 * OSGYM_VM_IDS}, headers=AUTH)
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "hosts kvm-a, kvm-b give OSGym vm ids the same number: the operator must rename one"
        assert all(a.host.replicas() and not any(x.lease for x in a.host.replicas()) for a in two_hosts.values())
