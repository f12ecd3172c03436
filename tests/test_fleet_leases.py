"""Where the gateway sends leases between two polls of its hosts: to a host that still has a ready replica, not to
full ones first (at 100 hosts, 10,000 leases made 31,439 calls in vain before: ``osfleet bench gateway``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from osfleet.fleet import hosts
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.json_server import Request, json_server

pytestmark = pytest.mark.unit

TOKEN = "gateway-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Host:
    """A host agent's lease answers: 201 while a ready replica is left, 503 ``capacity`` after."""

    def __init__(self, name: str, ready: int) -> None:
        self.name = name
        self.ready = ready
        self.asked = 0
        self.lock = threading.Lock()

    def answer(self, request: Request) -> tuple[int, Any]:
        if request.path == "/health":
            return 200, {"status": "ok"}
        if request.path == "/v1/host":
            return 200, {"replicas": {"ready": self.ready}, "capacity": {"max_replicas": 4, "replicas": 4}}
        if request.path == "/v1/leases":
            with self.lock:
                self.asked += 1
                if self.ready == 0:
                    return 503, {"kind": "capacity", "detail": "no ready replica"}
                self.ready -= 1
                n = self.asked
            return 201, {"replica_id": f"r-{n}", "lease_id": f"l-{n}", "expires_at": 0}
        return 404, {"detail": "not here"}


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, Host, Host]]:
    monkeypatch.setattr(hosts, "POLL_SECONDS", 3600.0)  # one poll at start: every lease after it is between polls
    one, two = Host("h1", 2), Host("h2", 2)
    with json_server(one.answer) as (url1, _), json_server(two.answer) as (url2, _):
        entries = [HostEntry(name="h1", url=url1, token="t1"), HostEntry(name="h2", url=url2, token="t2")]
        with TestClient(create_gateway(TOKEN, entries)) as client:
            yield client, one, two


def lease(client: TestClient) -> tuple[int, str]:
    r = client.post("/v1/leases", json={"holder": "test"}, headers=AUTH)
    return r.status_code, r.json().get("replica_id", "")


def test_leases_between_polls_go_where_replicas_are_left(fleet: tuple[TestClient, Host, Host]) -> None:
    client, one, two = fleet
    granted = [lease(client) for _ in range(4)]
    assert sorted(granted) == [(201, "h1.r-1"), (201, "h1.r-2"), (201, "h2.r-1"), (201, "h2.r-2")]
    assert (one.asked, two.asked) == (2, 2)  # no host was asked for a lease after its last one was taken


def test_a_host_that_refilled_since_its_last_poll_is_still_asked(fleet: tuple[TestClient, Host, Host]) -> None:
    client, one, two = fleet
    for _ in range(4):
        assert lease(client)[0] == 201
    assert lease(client)[0] == 503  # every host asked, none has one
    with two.lock:
        two.ready = 1  # its warm pool made one; the gateway has not polled since
    assert lease(client) == (201, f"h2.r-{two.asked}")
