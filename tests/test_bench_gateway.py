"""The gateway at 10,000 leases over simulated hosts routes each lease's step to the replica it holds, and what the
gateway bench counts is what the hosts saw. Correctness only: the bench's timings are its own business."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from osfleet.api.auth import load_clients
from osfleet.bench.gateway import Lease, _lease_all, _release_all, _step
from osfleet.bench.sim_hosts import HostSpec, SimHosts, _Host, total
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hostclient import HostClient
from osfleet.fleet.hosts import HostEntry

OPERATOR = "operator-token-0123456789"
CLIENT = "client-token-0123456789ab"


class Gateway:
    """What ``bench.gateway``'s phases need of the gateway: its URL, the client's headers, its CPU (not measured)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {CLIENT}"}

    def cpu_seconds(self) -> float:
        return 0.0


@pytest.mark.system  # the simulated hosts are a process of their own
@pytest.mark.slow  # 10,000 leases and their steps: 40 to 90 s on a 2-core machine
def test_ten_thousand_leases_each_step_reaches_the_replica_it_holds(served: Callable[..., str], tmp_path: Path) -> None:
    specs = [HostSpec(f"h{i + 1}", secrets.token_urlsafe(16), 100) for i in range(100)]
    clients = tmp_path / "clients"
    clients.write_text(f"bench {CLIENT}\n")
    with SimHosts(specs) as sim:
        entries = [HostEntry(name=s.name, url=u, token=s.token) for s, u in zip(specs, sim.urls, strict=True)]
        gateway = Gateway(served(create_gateway(OPERATOR, entries, clients=load_clients(clients, OPERATOR))))

        async def run() -> tuple[list[Lease], list[int], int]:
            async with HostClient() as client:
                held, counts, _, _ = await _lease_all(client, gateway, 10_000, 64)  # type: ignore[arg-type]
                assert counts.failed == 0, counts.reasons
                statuses: list[int] = []
                for i in range(0, len(held), 64):
                    batch = held[i : i + 64]
                    statuses += await asyncio.gather(
                        *(_step(client, gateway.url, x.replica, x.lease, x.lease, gateway.headers) for x in batch)
                    )
                released = await _release_all(client, gateway, held, 64)  # type: ignore[arg-type]
                return held, statuses, released.ok

        held, statuses, released = asyncio.run(run())
        tallies = sim.tallies()
    assert len(held) == 10_000 and len({x.replica for x in held}) == 10_000
    assert statuses == [200] * 10_000 and released == 10_000
    per_host = Counter(x.host for x in held)
    assert {name: t["steps"] for name, t in tallies.items()} == {s.name: per_host[s.name] for s in specs}
    seen = total(tallies)
    assert (seen["misrouted"], seen["duplicate_steps"], seen["releases"]) == (0, 0, 10_000)


@pytest.mark.unit
def test_a_simulated_host_refuses_what_a_host_agent_refuses() -> None:
    host = _Host(HostSpec("h1", "tok", 1))
    auth = {"authorization": "Bearer tok", "x-osfleet-client": "bench", "x-osfleet-gateway": "gw-1"}
    assert host.answer("GET", "/v1/host", {}, b"")[0] == 401
    status, grant = host.answer("POST", "/v1/leases", auth, b"")
    assert status == 201 and host.answer("POST", "/v1/leases", auth, b"")[0] == 503  # its only replica is leased
    rid, lease = grant["replica_id"], grant["lease_id"]
    body = b'{"lease_id": "%s", "action_id": "a1", "actions": [{"type": "wait"}]}' % lease.encode()
    assert host.answer("POST", f"/v1/replicas/{rid}/step", auth, body)[1]["replayed"] is False
    assert host.answer("POST", f"/v1/replicas/{rid}/step", auth, body)[1]["replayed"] is True
    other_client = {**auth, "x-osfleet-client": "eve"}
    assert host.answer("POST", f"/v1/replicas/{rid}/step", other_client, body)[0] == 409
    assert host.answer("POST", "/v1/replicas/r-elsewhere/step", auth, body)[0] == 409
    assert host.tally.steps == 1 and host.tally.duplicate_steps == 1 and host.tally.misrouted == 2
