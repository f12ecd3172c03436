"""Principals that come from different authorities never collide on a host. Two gateways in front of one host
agent each have a client named ``alice`` (different people, different tokens); the host also has an ``alice`` of
its own clients file. Each is its own principal on the host: none of them sees, steps or releases another's
replica (404, as for a replica that does not exist), through its gateway or directly.

Real servers on loopback (uvicorn): the host agent over the test fakes, two gateways with their own tokens and
clients files, all reaching the host with its operator token as deployed gateways do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.fakes import FakeHost

pytestmark = pytest.mark.unit

HOST_TOKEN = "the-hosts-operator-token-0123"
WAIT = [{"type": "wait", "seconds": 0}]


@dataclass
class Door:
    """One way in for one ``alice``: a server's URL and her token there."""

    url: str
    token: str

    def call(self, method: str, path: str, body: object = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.request(method, self.url + path, json=body, headers=headers, timeout=30)


@pytest.fixture
def doors(tmp_path: Path, served: Callable[..., str]) -> dict[str, Door]:
    host_clients = tmp_path / "host-clients"
    host_clients.write_text("alice alice-of-the-host-0123456789\n")
    config = AgentConfig(token=HOST_TOKEN, warm=0, clients=load_clients(host_clients, HOST_TOKEN))
    host = served(create_app(config, lambda: FakeHost(tmp_path / "home", ready=4)))
    out = {"host": Door(host, "alice-of-the-host-0123456789")}
    for gw in ("gw1", "gw2"):
        own, alice = f"{gw}-operator-token-0123456789", f"alice-of-{gw}-0123456789"
        clients = tmp_path / f"{gw}-clients"
        clients.write_text(f"alice {alice}\n")
        entry = HostEntry(name="h1", url=host, token=HOST_TOKEN)
        out[gw] = Door(served(create_gateway(own, [entry], clients=load_clients(clients, own))), alice)
    return out


def test_the_same_client_name_through_two_gateways_is_two_principals(doors: dict[str, Door]) -> None:
    first, second, local = doors["gw1"], doors["gw2"], doors["host"]
    lease = first.call("POST", "/v1/leases", {"holder": "alice"}).json()
    rid, lid = lease["replica_id"], lease["lease_id"]
    local_rid = rid.split(".", 1)[1]
    assert [r["id"] for r in first.call("GET", "/v1/replicas").json()] == [rid]
    assert second.call("GET", "/v1/replicas").json() == []  # the other gateway's alice holds nothing
    assert local.call("GET", "/v1/replicas").json() == []  # nor does the host's own alice
    step = {"lease_id": lid, "action_id": "a1", "actions": WAIT, "observe": False}
    for door, path in ((second, f"/v1/replicas/{rid}"), (local, f"/v1/replicas/{local_rid}")):
        for op, body in (("step", step), ("release", {"lease_id": lid}), ("evaluate", {"lease_id": lid})):
            r = door.call("POST", f"{path}/{op}", body)
            assert r.status_code == 404, (door.url, op, r.text)
        assert door.call("DELETE", path).status_code == 404
    assert first.call("POST", f"/v1/replicas/{rid}/step", step).status_code == 200  # still hers alone


def test_each_gateway_has_its_own_stable_name_on_its_hosts() -> None:
    from osfleet.api.auth import gateway_id

    assert gateway_id("gw1-operator-token-0123456789") == gateway_id("gw1-operator-token-0123456789")
    assert gateway_id("gw1-operator-token-0123456789") != gateway_id("gw2-operator-token-0123456789")
    assert "0123456789" not in gateway_id("gw1-operator-token-0123456789")
