"""One tenant's long-polls cannot get a host drained: the gateway's health polls go over connections of their own.

The attack, as a tenant would make it: as many tunnel receives as the gateway keeps connections to a host (the
limit is lowered here to 4, so the test does not need 256 threads), each waiting on the host for bytes that never
come. Were the health polls queued behind them for a connection, they would miss their deadline twice and the host,
healthy all along, would be drained: every other tenant's episode on it would end as an infrastructure failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from osfleet.api.auth import load_clients
from osfleet.fleet import hostclient, hosts
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.json_server import Request, json_server

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.
pytestmark = pytest.mark.integration

OPERATOR = "operator-token-0123456789"
EVE = "eve-token-0123456789abc"
HOST_TOKEN = "host-token-0123456789"
CONNECTIONS = 4  # the gateway's connections to a host, lowered from 256 for the test
WAIT_SECONDS = 20.0


class LongPollHost:
    """A host whose tunnel receives wait until released; it counts its health polls and the receives in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.changed = threading.Condition()
        self.in_flight = 0
        self.health = 0

    def answer(self, request: Request) -> tuple[int, Any]:
        if request.path == "/health":
            with self.changed:
                self.health += 1
                self.changed.notify_all()
            return 200, {"status": "ok"}
        if request.path == "/v1/host":
            return 200, {"replicas": {"ready": 1}, "capacity": {"max_replicas": 4, "replicas": 1}}
        if request.path.startswith("/v1/replicas/r-1/tunnel"):
            with self.changed:
                self.in_flight += 1
                self.changed.notify_all()
            self.release.wait(WAIT_SECONDS)  # bytes that never come, until the test ends
            return 200, {}
        return 404, {"detail": "not here"}

    def wait_for(self, check: Callable[[], bool], seconds: float) -> bool:
        with self.changed:
            return self.changed.wait_for(check, seconds)


@pytest.fixture
def host() -> Iterator[tuple[LongPollHost, str]]:
    fake = LongPollHost()
    with json_server(fake.answer) as (url, _):
        try:
            yield fake, url
        finally:
            fake.release.set()


def test_long_polls_holding_every_connection_do_not_drain_a_healthy_host(
    host: tuple[LongPollHost, str], served: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, host_url = host
    monkeypatch.setattr(hostclient, "MAX_CONNECTIONS_PER_HOST", CONNECTIONS)
    monkeypatch.setattr(hosts, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(hosts, "POLL_TIMEOUT_SECONDS", 0.5)
    clients = tmp_path / "clients"
    clients.write_text(f"eve {EVE}\n")
    entry = HostEntry(name="h1", url=host_url, token=HOST_TOKEN)
    gateway = served(create_gateway(OPERATOR, [entry], clients=load_clients(clients, OPERATOR)))

    def health() -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{gateway}/health", headers={"Authorization": f"Bearer {OPERATOR}"}).json()
        return body["hosts"]["h1"]

    assert health()["healthy"]

    def long_poll(_: int) -> int:
        query = {"lease_id": "h1.l-1", "tunnel_id": "t-1", "wait": 25}
        r = httpx.get(
            f"{gateway}/v1/replicas/h1.r-1/tunnel", params=query, headers={"Authorization": f"Bearer {EVE}"},
            timeout=WAIT_SECONDS + 10,
        )  # fmt: skip
        return r.status_code

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        polls = [pool.submit(long_poll, i) for i in range(CONNECTIONS)]
        assert fake.wait_for(lambda: fake.in_flight == CONNECTIONS, 10), "the long-polls did not all reach the host"
        # every connection the gateway keeps to the host is held; three poll rounds more, or the host drained
        seen = fake.health
        deadline = time.monotonic() + 10
        while fake.health < seen + 3 and health()["healthy"] and time.monotonic() < deadline:
            fake.wait_for(lambda: fake.health >= seen + 3, 0.2)
        state = health()
        fake.release.set()
        assert [p.result() for p in polls] == [200] * CONNECTIONS
    assert state["healthy"], f"the host was drained: {state['reason']}"
    assert fake.health >= seen + 3, "the health polls did not reach the host while the long-polls held"
