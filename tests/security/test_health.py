"""An open port tells nobody how busy a host is: ``/health`` answers up or down to anyone, the replicas by state
only to the operator's token (a client's token adds the image and the body limit, never the counts), on a host
agent and on the gateway (whose detail names its hosts and why they fail). The acceptance checks' ``wait_healthy``
(200 on ``/health``) keeps working without a token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.fakes import FakeHost

pytestmark = pytest.mark.unit

OPERATOR = "operator-token-0123456789"
ALICE = "alice-token-0123456789"
OP = {"Authorization": f"Bearer {OPERATOR}"}
A = {"Authorization": f"Bearer {ALICE}"}


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[TestClient, FakeHost]]:
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\n")
    fake = FakeHost(tmp_path / "home", ready=3)
    config = AgentConfig(token=OPERATOR, warm=0, clients=load_clients(clients, OPERATOR))
    with TestClient(create_app(config, lambda: fake)) as c:
        yield c, fake


def test_without_a_token_health_says_only_up_or_down(host: tuple[TestClient, FakeHost]) -> None:
    c, fake = host
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {**OP, "X-Osfleet-Client": "a b", "X-Osfleet-Gateway": "gw-1"},
    ):
        r = c.get("/health", headers=headers)
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
    fake.alive = False
    r = c.get("/health")
    assert (r.status_code, r.json()) == (503, {"status": "failing"})


def test_a_clients_token_learns_the_image_not_the_counts(host: tuple[TestClient, FakeHost]) -> None:
    c, _ = host
    body = c.get("/health", headers=A).json()
    assert body["status"] == "ok" and body["image"] and "replicas" not in body
    full = c.get("/health", headers=OP).json()
    assert full["replicas"] == {"ready": 3} and full["image"] == body["image"]


def test_the_gateways_health_names_its_hosts_to_the_operator_only(tmp_path: Path) -> None:
    entry = HostEntry(name="kvm7", url="http://127.0.0.1:9", token="the-hosts-token-0123456789")
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\n")
    app = create_gateway(OPERATOR, [entry], clients=load_clients(clients, OPERATOR))
    with TestClient(app) as gw:
        r = gw.get("/health")
        assert r.json() == {"status": r.json()["status"]} and "kvm7" not in r.text
        r = gw.get("/health", headers=A)  # a client learns the body limit (the SDK checks uploads against it)
        assert r.json() == {"status": r.json()["status"], "max_body_bytes": 16 * 2**20} and "kvm7" not in r.text
        assert "kvm7" in gw.get("/health", headers=OP).json()["hosts"]
