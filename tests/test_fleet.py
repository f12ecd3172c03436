"""The fleet gateway over real host agents on loopback (fake guests, no VM): routing by fleet ids,
placement on uneven hosts, failover when a host dies, OSGym clients, a restarted gateway."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import ON_BEHALF_OF, gateway_id, load_clients
from osfleet.config import AgentConfig
from osfleet.fleet import placement
from osfleet.fleet.app import DEADLINES, create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.fakes import FakeHost

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.

TOKEN = "gateway-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHELL = [{"type": "shell", "command": "echo hi"}]
TASK = {
    "id": "t1",
    "instruction": "Run something.",
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "check"},
        "expected": {"type": "rule", "rules": {"expected": "yes\n"}},  # OSWorld's exact_match: the whole output
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Agent:
    """A real host agent (uvicorn on loopback) over a fake host."""

    name: str
    host: FakeHost
    port: int
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None

    @property
    def entry(self) -> HostEntry:
        return HostEntry(name=self.name, url=f"http://127.0.0.1:{self.port}", token=f"token-{self.name}")

    def start(self) -> None:
        app = create_app(AgentConfig(token=f"token-{self.name}"), lambda: self.host)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(10)
            self.server = None


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Agent]]:
    # The fake hosts share this (busy, 2-core) machine: give them a steady one, so rooms are exact.
    machine = {"cpu_busy_share": 0.0, "cpus": 64, "memory_total_bytes": 256 * 2**30, "memory_used_bytes": 0}
    monkeypatch.setattr("osfleet.api.routes.replicas.host_usage", lambda: dict(machine))
    made = {
        "big": Agent("big", FakeHost(tmp_path / "big", ready=1, max_replicas=10), free_port()),
        "small": Agent("small", FakeHost(tmp_path / "small", ready=1, max_replicas=3), free_port()),
    }
    for a in made.values():
        a.start()
    yield made
    for a in made.values():
        a.stop()


def gateway(agents: dict[str, Agent]) -> TestClient:
    return TestClient(create_gateway(TOKEN, [a.entry for a in agents.values()], osgym_allowed_ips=()))


@pytest.mark.integration
def test_placement_packs_on_the_binding_resource() -> None:
    sample = {
        "replicas": {"ready": 1},
        "cpus": 64,
        "cpu_busy_share": 0.0,
        "memory_total_bytes": 64 * 2**30,
        "memory_used_bytes": 4 * 2**30,
    }
    big = placement.room(
        "big", {**sample, "capacity": {"max_replicas": 100, "replicas": 2, "rss_bytes_per_replica": 2**30}}
    )
    assert big.binding == "memory" and big.replicas == (64 - 4 - 2) * 2**30 // 2**30
    small = placement.room("small", {**sample, "capacity": {"max_replicas": 5, "replicas": 2}})
    assert small.binding == "max_replicas" and small.replicas == 3
    assert placement.scale_plan([big, small], 2) == {"small": 2}  # best fit: the big host stays free
    assert placement.scale_plan([big, small], 10) == {"big": 10}
    assert placement.scale_plan([big, small], 60) == {"big": 58, "small": 2}
    assert placement.scale_plan([big, small], 62) == {}
    assert placement.lease_order([big, small]) == ["small", "big"]  # the fuller host first


@pytest.mark.system
def test_a_client_cannot_tell_the_fleet_from_one_host(agents: dict[str, Agent]) -> None:
    with gateway(agents) as gw:
        rooms_known(gw)
        r = gw.post("/v1/leases", json={"holder": "t"}, headers=AUTH)
        assert r.status_code == 201, r.text
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        host = rid.split(".")[0]
        assert host in agents and lid.startswith(f"{host}.")
        r = gw.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK, "observe": False}, headers=AUTH)
        assert r.status_code == 200 and r.json()["replica_id"] == rid
        assert "total;dur=" in r.headers["server-timing"]  # where the host spent the time, relayed with its ids
        step = {"lease_id": lid, "action_id": "a1", "actions": SHELL, "observe": False}
        r = gw.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH)
        assert r.json()["replayed"] is False and "total;dur=" in r.headers["server-timing"]  # and as it was
        assert gw.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH).json()["replayed"] is True
        assert gw.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH).json()["reward"] == 1.0
        other = "small" if host == "big" else "big"
        r = gw.post(f"/v1/replicas/{other}.{rid.split('.')[1]}/evaluate", json={"lease_id": lid}, headers=AUTH)
        assert r.status_code == 409 and "does not hold" in r.json()["error"]
        assert gw.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=AUTH).status_code == 200
        listed = gw.get("/v1/replicas", headers=AUTH).json()
        assert {x["host"] for x in listed} == {"big", "small"} and all(x["id"].startswith(x["host"]) for x in listed)
        assert gw.get("/v1/leases", headers=AUTH).status_code == 405
        assert gw.post("/v1/leases", json={}).status_code == 401


def rooms_known(gw: TestClient) -> dict[str, dict[str, object]]:
    """Every host's entry once the gateway has polled them all healthy (slow starts on a busy machine)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hosts = gw.get("/v1/host", headers=AUTH).json()["hosts"]
        if all(h["healthy"] and h["room"] for h in hosts.values()):
            return hosts  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"the gateway did not see every host healthy: {hosts}")


@pytest.mark.integration
def test_scale_up_goes_where_it_fits_most_tightly(agents: dict[str, Agent]) -> None:
    with gateway(agents) as gw:
        rooms_known(gw)
        r = gw.post("/v1/replicas", json={"count": 2}, headers=AUTH)
        assert r.status_code == 202, r.text
        assert r.json()["placement"] == {"small": 2}
        deadline = time.monotonic() + 10  # until a poll has seen the new replicas on the small host
        while time.monotonic() < deadline:
            rooms = gw.get("/v1/host", headers=AUTH).json()["hosts"]
            if rooms["small"]["room"] and rooms["small"]["room"]["replicas"] == 0:
                break
            time.sleep(0.1)
        assert rooms["small"]["room"]["replicas"] == 0
        r = gw.post("/v1/replicas", json={"count": 5}, headers=AUTH)
        assert r.json()["placement"] == {"big": 5}
        r = gw.post("/v1/replicas", json={"count": 50}, headers=AUTH)
        assert r.status_code == 503 and r.json()["kind"] == "capacity"


@pytest.mark.integration
def test_a_dead_host_is_drained_its_episode_ends_as_infrastructure_and_leases_go_elsewhere(
    agents: dict[str, Agent],
) -> None:
    with gateway(agents) as gw:
        rooms_known(gw)
        first = gw.post("/v1/leases", json={"holder": "t"}, headers=AUTH).json()
        dead = first["replica_id"].split(".")[0]
        agents[dead].stop()
        step = {"lease_id": first["lease_id"], "action_id": "a1", "actions": SHELL, "observe": False}
        r = gw.post(f"/v1/replicas/{first['replica_id']}/step", json=step, headers=AUTH)
        assert r.status_code == 503 and r.json()["kind"] == "infrastructure" and dead in r.json()["error"]
        assert r.json()["error"] != "" and "reward" not in r.json()
        nxt = gw.post("/v1/leases", json={"holder": "t"}, headers=AUTH)
        assert nxt.status_code == 201 and not nxt.json()["replica_id"].startswith(f"{dead}.")
        health = gw.get("/health", headers=AUTH).json()
        assert health["status"] == "ok" and health["hosts"][dead]["healthy"] is False
        metrics = gw.get("/metrics", headers=AUTH).text
        assert f'osfleet_gateway_drains{{host="{dead}"}} 1.0' in metrics
        agents[dead].start()  # it comes back: the next good poll lets it rejoin
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not gw.get("/health", headers=AUTH).json()["hosts"][dead]["healthy"]:
            time.sleep(0.2)
        assert gw.get("/health", headers=AUTH).json()["hosts"][dead]["healthy"] is True


@pytest.mark.system
def test_osgym_clients_through_the_gateway_own_only_their_vms(agents: dict[str, Agent], tmp_path: Path) -> None:
    with tenant_gateway(agents, tmp_path) as gw:
        rooms_known(gw)
        a = gw.post("/reset", json={"task_config": TASK, "timeout": 600}, headers=ALICE)
        assert a.status_code == 200, a.text
        vm = a.json()["vm_id"]
        b = gw.post("/reset", json={"task_config": TASK, "timeout": 600}, headers=BOB)
        assert b.status_code == 200, b.text
        bob_vm = b.json()["vm_id"]
        # bob, and bob claiming to be alice (the gateway drops the header), cannot touch alice's vm
        for who in (BOB, {**BOB, ON_BEHALF_OF: "alice"}):
            assert gw.post("/step", json={"action": "click(1,2)", "vm_id": vm}, headers=who).status_code == 404
            assert gw.get("/screenshot", params={"vmId": vm}, headers=who).status_code == 404
            assert gw.post("/shutdown", json={"vm_id": vm}, headers=who).status_code == 404
        assert gw.post("/shutdown", json={"vm_id": "all"}, headers=BOB).status_code == 200  # bob's own only
        assert gw.post("/step", json={"action": "click(1,2)", "vm_id": bob_vm}, headers=BOB).status_code == 404
        r = gw.post("/step", json={"action": "click(1,2)", "vm_id": vm}, headers=ALICE)
        assert r.status_code == 200 and r.json()["is_finish"] is False
        assert gw.get("/screenshot", params={"vmId": vm}, headers=ALICE).json()["vm_id"] == vm
        assert gw.post("/shutdown", json={"vm_id": "all"}, headers=ALICE).status_code == 200
        assert gw.post("/step", json={"action": "finish()", "vm_id": vm}, headers=ALICE).status_code == 404
        assert gw.post("/step", json={"action": "finish()", "vm_id": 7_000_000}, headers=ALICE).status_code == 404


ALICE = {"Authorization": "Bearer alice-token-0123456789"}
BOB = {"Authorization": "Bearer bob-token-0123456789"}


def tenant_gateway(agents: dict[str, Agent], tmp_path: Path) -> TestClient:
    clients = tmp_path / "clients"
    clients.write_text("alice alice-token-0123456789\nbob bob-token-0123456789\n")
    entries = [a.entry for a in agents.values()]
    return TestClient(create_gateway(TOKEN, entries, clients=load_clients(clients, TOKEN)))


@pytest.mark.integration
def test_through_the_gateway_a_client_sees_and_touches_only_its_own(agents: dict[str, Agent], tmp_path: Path) -> None:
    with tenant_gateway(agents, tmp_path) as gw:
        rooms_known(gw)
        r = gw.post("/v1/leases", json={"holder": "a"}, headers=ALICE)
        assert r.status_code == 201, r.text
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        host = agents[rid.split(".")[0]].host
        local = rid.split(".", 1)[1]
        # the host knows whose it is: the gateway named her, as its own client (auth.gateway_id)
        assert host.get(local).lease.owner == f"{gateway_id(TOKEN)}/alice"
        step = {"lease_id": lid, "action_id": "x", "actions": SHELL, "observe": False}
        for who in (BOB, {**BOB, ON_BEHALF_OF: "alice"}):  # the header a client sends is dropped at the edge
            assert [x["id"] for x in gw.get("/v1/replicas", headers=who).json()] == []
            for method, path, body in [
                ("POST", f"/v1/replicas/{rid}/step", step),
                ("POST", f"/v1/replicas/{rid}/reset", {"lease_id": lid, "observe": False}),
                ("GET", f"/v1/replicas/{rid}/observation?lease_id={lid}", None),
                ("POST", f"/v1/replicas/{rid}/evaluate", {"lease_id": lid}),
                ("POST", f"/v1/replicas/{rid}/fork", {"lease_id": lid, "children": 1}),
                ("POST", f"/v1/replicas/{rid}/release", {"lease_id": lid}),
                ("DELETE", f"/v1/replicas/{rid}", None),
            ]:
                r = gw.request(method, path, json=body, headers=who)
                assert r.status_code == 404, (method, path, r.text)
        assert host.applied == [] and host.forked == []
        assert [x["id"] for x in gw.get("/v1/replicas", headers=ALICE).json()] == [rid]
        assert gw.post(f"/v1/replicas/{rid}/step", json=step, headers=ALICE).status_code == 200
        root = {**step, "action_id": "root", "actions": [{"type": "shell", "command": "id -u", "as_root": True}]}
        r = gw.post(f"/v1/replicas/{rid}/step", json=root, headers=ALICE)
        assert r.status_code == 403 and "as_root" in r.json()["error"]  # the host's rule, for alice
        assert gw.post(f"/v1/replicas/{rid}/step", json=root, headers=AUTH).status_code == 200  # the operator's
        for method, path in [("GET", "/v1/host"), ("POST", "/v1/replicas")]:
            assert gw.request(method, path, json={"count": 1}, headers=ALICE).status_code == 403
        assert gw.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=ALICE).status_code == 200


@pytest.mark.integration
def test_a_restarted_gateway_carries_on_with_the_same_fleet_ids(agents: dict[str, Agent]) -> None:
    with gateway(agents) as gw:
        rooms_known(gw)
        r = gw.post("/v1/leases", json={"holder": "t"}, headers=AUTH).json()
    with gateway(agents) as gw:  # a new process: nothing remembered but the hosts list
        rooms_known(gw)
        step = {"lease_id": r["lease_id"], "action_id": "a1", "actions": SHELL, "observe": False}
        assert gw.post(f"/v1/replicas/{r['replica_id']}/step", json=step, headers=AUTH).status_code == 200


@pytest.mark.integration
def test_the_gateway_overhead_is_measured_on_one_replica_both_ways(agents: dict[str, Agent]) -> None:
    from types import SimpleNamespace

    from osfleet.bench.chaos import gateway_overhead

    port = free_port()
    inner = create_gateway(TOKEN, [a.entry for a in agents.values()])

    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        """The gateway with a known 40 ms added to each step: the measurement must find it."""
        if scope["type"] == "http" and scope["path"].endswith("/step"):
            await asyncio.sleep(0.04)
        await inner(scope, receive, send)  # type: ignore[arg-type]

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        gw = SimpleNamespace(url=f"http://127.0.0.1:{port}", headers=AUTH)
        hosts = [SimpleNamespace(name=a.name, url=a.entry.url, token=a.entry.token) for a in agents.values()]
        out = gateway_overhead(gw, hosts, rounds=10, warmup=2)  # type: ignore[arg-type]
        assert out["rounds"] == 10 and out["direct_p50_ms"] > 0 and out["gateway_p50_ms"] > 0
        # the p50 of the per-round differences finds the 40 ms the gateway was made to add, and no more
        assert 35 <= out["added_p50_ms"] <= 35 + out["direct_p50_ms"] + 60, out
        assert out["gateway_p50_ms"] - out["direct_p50_ms"] >= 30, out
        applied = [a.host.applied for a in agents.values() if a.host.applied]
        assert len(applied) == 1 and len(applied[0]) == 24  # one replica, every step really ran, twelve each way
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.integration
def test_a_fork_through_the_gateway_gives_fleet_ids_on_the_parents_host(agents: dict[str, Agent]) -> None:
    with gateway(agents) as gw:
        rooms_known(gw)
        r = gw.post("/v1/leases", json={"holder": "t"}, headers=AUTH)
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        host = rid.split(".")[0]
        r = gw.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 2}, headers=AUTH)
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["parent_id"] == rid and len(body["children"]) == 2
        for child in body["children"]:
            cid, clid = child["replica_id"], child["lease_id"]
            assert cid.startswith(f"{host}.") and clid.startswith(f"{host}.")
            r = gw.post(f"/v1/replicas/{cid}/release", json={"lease_id": clid}, headers=AUTH)
            assert r.status_code == 200 and r.json()["replica_id"] == cid
        assert agents[host].host.forked == [rid.split(".", 1)[1]]
        r = gw.post(f"/v1/replicas/{rid}/fork", json={"lease_id": lid, "children": 1000}, headers=AUTH)
        assert r.status_code == 422


@pytest.mark.integration
def test_observations_through_the_gateway_take_the_hosts_formats_and_quality(agents: dict[str, Agent]) -> None:
    with gateway(agents) as gw:
        rooms_known(gw)
        r = gw.post("/v1/leases", json={"holder": "t"}, headers=AUTH)
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        params: dict[str, str | int] = {"lease_id": lid, "format": "webp", "quality": 40}
        r = gw.get(f"/v1/replicas/{rid}/observation", params=params, headers=AUTH)
        assert r.status_code == 200 and r.json()["format"] == "webp", r.text
        assert agents[rid.split(".")[0]].host.shots[-1] == ("webp", 40)
        r = gw.get(f"/v1/replicas/{rid}/observation", params={**params, "quality": 0}, headers=AUTH)
        assert r.status_code == 422


class LeaseStub:
    """A host agent's lease as seen from outside: it answers after ``delay`` seconds, counting what it granted."""

    def __init__(self, delay: float) -> None:
        from fastapi import FastAPI

        self.granted = 0
        self.port = free_port()
        app = FastAPI()

        @app.get("/health")
        def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/host")
        def sample() -> dict[str, object]:
            return {"replicas": {"ready": 1}}

        @app.post("/v1/leases", status_code=201)
        def lease() -> dict[str, object]:
            time.sleep(delay)
            self.granted += 1
            return {"replica_id": "r-1", "lease_id": f"l-{self.granted}", "expires_at": 0}

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def entry(self, name: str) -> HostEntry:
        return HostEntry(name=name, url=f"http://127.0.0.1:{self.port}", token="host-token")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.mark.integration
def test_a_lease_is_not_failed_over_from_a_host_that_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slow host may still lease (it did, here): trying the next host too would leave an orphan lease."""
    monkeypatch.setitem(DEADLINES, "lease", 0.5)
    slow, fine = LeaseStub(delay=1.5), LeaseStub(delay=0)
    try:
        with TestClient(create_gateway(TOKEN, [slow.entry("a-slow"), fine.entry("b-fine")])) as gw:
            r = gw.post("/v1/leases", json={}, headers=AUTH)  # a-slow is tried first (placement: by name on a tie)
            assert r.status_code == 503 and r.json()["kind"] == "infrastructure" and "a-slow" in r.json()["error"]
            assert fine.granted == 0  # no second lease elsewhere
            deadline = time.monotonic() + 5
            while slow.granted == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert slow.granted == 1  # the timed-out host did lease: the client is told to try again, not given two
    finally:
        slow.stop()
        fine.stop()


@pytest.mark.integration
def test_a_lease_is_failed_over_from_a_host_that_refused_the_connection() -> None:
    gone, fine = LeaseStub(delay=0), LeaseStub(delay=0)
    try:
        with TestClient(create_gateway(TOKEN, [gone.entry("a-gone"), fine.entry("b-fine")])) as gw:
            gone.stop()  # seen healthy, then gone: its port refuses connections
            r = gw.post("/v1/leases", json={}, headers=AUTH)
            assert r.status_code == 201 and r.json()["replica_id"].startswith("b-fine."), r.text
            assert "osfleet_gateway_failovers_total 1.0" in gw.get("/metrics", headers=AUTH).text
    finally:
        fine.stop()
