"""Tunnels over HTTP without a VM: the host agent's four calls, the gateway's relay of them and the SDK's
``Session.forward``, over the fake host whose guests' channels are UNIX sockets served by the guest's real relay
(``tests/fake_guest_channels.py``), reaching a real TCP server on this machine's loopback. On a real replica:
tests/test_tunnels_vm.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osfleet.client import ConflictError, Fleet, NotFoundError
from osfleet.fleet.app import create_gateway
from tests.fakes import FakeHost
from tests.test_fleet import Agent, free_port

pytestmark = pytest.mark.integration  # real sockets and servers; ~20 s in sum, over the unit tier's budget


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent("h1", FakeHost(tmp_path / "h1", ready=2), free_port())
    a.start()
    yield a
    a.stop()
    a.host.tunnels.shutdown()
    a.host.guest_channels.close()


@pytest.fixture
def echo() -> Iterator[int]:
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conns.append(conn)

            def run(c: socket.socket = conn) -> None:
                try:
                    while data := c.recv(65536):
                        c.sendall(data)
                except OSError:
                    pass
                finally:
                    c.close()

            threading.Thread(target=run, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    for c in conns:
        c.close()


def closed_port() -> int:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_the_sdk_forwards_a_local_port_into_the_replica(agent: Agent, echo: int) -> None:
    url, token = f"http://127.0.0.1:{agent.port}", f"token-{agent.name}"
    data = bytes(range(256)) * 1024  # every byte value, several frames
    with Fleet(url, token) as fleet, fleet.lease() as s, fleet.lease() as other:
        with s.forward(echo) as fwd, socket.create_connection(("127.0.0.1", fwd.port), timeout=30) as c:
            c.sendall(data)
            got = b""
            while len(got) < len(data):
                got += c.recv(1 << 20)
            assert got == data
        with pytest.raises(ConflictError, match="nothing accepted"):
            s.open_tunnel(closed_port())
        tunnel = s.open_tunnel(echo)
        with pytest.raises(NotFoundError):  # another lease, another replica: not its tunnel
            other.tunnel_send(tunnel, b"x")
        s.tunnel_send(tunnel, b"ping")
        assert s.tunnel_receive(tunnel, wait=10) == b"ping"
        assert s.tunnel_receive(tunnel, wait=0.2) == b""  # nothing more came
        s.close_tunnel(tunnel)
        assert s.tunnel_receive(tunnel, wait=1) is None  # closed: 404
        live = s.open_tunnel(echo)
        s.reset()  # a new generation: the tunnel of the old one is over
        with pytest.raises(NotFoundError, match="reset"):
            s.tunnel_send(live, b"after reset")


def test_the_gateway_relays_tunnels_and_keeps_them_the_leases(agent: Agent, echo: int) -> None:
    gw_token = "gateway-token-0123456789"
    auth = {"Authorization": f"Bearer {gw_token}"}
    with TestClient(create_gateway(gw_token, [agent.entry])) as gw:
        r = gw.post("/v1/leases", json={"holder": "t"}, headers=auth)
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        r = gw.post(f"/v1/replicas/{rid}/tunnels", json={"lease_id": lid, "port": echo}, headers=auth)
        assert r.status_code == 201, r.text
        q = {"lease_id": lid, "tunnel_id": r.json()["tunnel_id"]}
        raw = {**auth, "Content-Type": "application/octet-stream"}
        r = gw.put(f"/v1/replicas/{rid}/tunnel", params=q, content=b"\x00through\xff", headers=raw)
        assert r.status_code == 200 and r.json() == {"bytes": 9}, r.text
        r = gw.get(f"/v1/replicas/{rid}/tunnel", params={**q, "wait": 10}, headers=auth)
        assert r.status_code == 200 and r.content == b"\x00through\xff"
        assert r.headers["content-type"] == "application/octet-stream"
        r = gw.post(f"/v1/replicas/{rid}/tunnels", json={"lease_id": lid, "port": closed_port()}, headers=auth)
        assert r.status_code == 409 and r.json()["kind"] == "conflict" and "nothing accepted" in r.json()["error"]
        r = gw.get(f"/v1/replicas/{rid}/tunnel", params={**q, "tunnel_id": "t-guessed"}, headers=auth)
        assert r.status_code == 404 and r.json()["kind"] == "not_found"
        r = gw.get(f"/v1/replicas/{rid}/tunnel", params={**q, "wait": 99}, headers=auth)
        assert r.status_code == 422  # at most 25 s
        r = gw.delete(f"/v1/replicas/{rid}/tunnel", params=q, headers=auth)
        assert r.status_code == 200 and r.json()["closed"] is True
        r = gw.put(f"/v1/replicas/{rid}/tunnel", params=q, content=b"late", headers=raw)
        assert r.status_code == 404


def test_waiting_receives_hold_no_worker_thread(agent: Agent, echo: int) -> None:
    """More receives waiting at once than the host has worker threads (40): other calls are still answered."""
    import httpx2 as httpx

    url, auth = f"http://127.0.0.1:{agent.port}", {"Authorization": f"Bearer token-{agent.name}"}
    with Fleet(url, f"token-{agent.name}") as fleet, fleet.lease() as s:
        tunnel = s.open_tunnel(echo)
        q = {"lease_id": s.lease_id, "tunnel_id": tunnel, "wait": 8}
        answers: list[int] = []

        def receive() -> None:
            r = httpx.get(f"{url}/v1/replicas/{s.replica_id}/tunnel", params=q, headers=auth, timeout=30)
            answers.append(r.status_code)

        waiting = [threading.Thread(target=receive) for _ in range(60)]
        for t in waiting:
            t.start()
        stream = agent.host.tunnels._streams[tunnel]
        deadline = time.monotonic() + 20
        while len(stream.waiters) < 60 and time.monotonic() < deadline:  # every one of them waiting now
            time.sleep(0.05)
        assert len(stream.waiters) == 60
        started = time.monotonic()
        r = httpx.get(f"{url}/v1/replicas", headers=auth, timeout=30)
        assert r.status_code == 200 and time.monotonic() - started < 3.0
        for t in waiting:
            t.join(30)
        assert answers == [200] * 60
