"""Red team: one tenant floods a host agent; another tenant of the same host must not pay for it.

A real host agent (uvicorn on loopback, in a thread) over the test fakes, with two clients (``alice`` floods, ``bob``
works): alice's requests in flight, the bodies she has the server take in, and her evaluations are each bounded by
her own share (``osfleet.api.admission``): past it she gets 429 with ``Retry-After`` and a JSON reason, before any
of it is done or read, and bob's requests go through meanwhile. A body queued behind the same client's request on
the same replica is not read before its turn: the kernel's socket buffers hold it, never the server's memory.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from osfleet.api.admission import REQUESTS_PER_LEASE, SPARE_REQUESTS
from osfleet.api.app import create_app
from osfleet.api.auth import digest
from osfleet.config import AgentConfig, ClientToken
from tests.fakes import FakeHost
from tests.test_fleet import free_port
from tests.test_tenants import ALICE, BOB, OPERATOR, TASK, WAIT, A, B

pytestmark = pytest.mark.integration  # a server on loopback, seconds of waits in sum

BODY_LIMIT = 32 * 2**20


@dataclass
class Host:
    fake: FakeHost
    url: str


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    fake = FakeHost(tmp_path / "h", ready=4, max_replicas=8)
    config = AgentConfig(
        token=OPERATOR,
        warm=0,
        clients=(ClientToken("alice", digest(ALICE)), ClientToken("bob", digest(BOB))),
        max_body_bytes=BODY_LIMIT,
        client_share=0.01,  # one evaluation at a time per client, whatever this machine's evaluation workers
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config, lambda: fake), "127.0.0.1", port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the host agent did not start"
        time.sleep(0.02)
    try:
        yield Host(fake, f"http://127.0.0.1:{port}")
    finally:
        if fake.act_gate is not None:
            fake.act_gate.set()
        if fake.shell_gate is not None:
            fake.shell_gate.set()
        server.should_exit = True
        thread.join(15)


def lease(h: Host, headers: dict[str, str]) -> tuple[str, str]:
    r = httpx.post(f"{h.url}/v1/leases", json={"holder": "t"}, headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def step(h: Host, headers: dict[str, str], rid: str, lid: str, action_id: str) -> httpx.Response:
    body = {"lease_id": lid, "action_id": action_id, "actions": WAIT, "observe": False}
    return httpx.post(f"{h.url}/v1/replicas/{rid}/step", json=body, headers=headers, timeout=60)


def wait_for(what: Any, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def in_use(h: Host, client: str, resource: str) -> float:
    """What ``client`` holds of ``resource`` now, as the host's /metrics says (``osfleet_client_in_use``)."""
    text = httpx.get(f"{h.url}/metrics", headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=10).text
    line = f'osfleet_client_in_use{{client="{client}",resource="{resource}"}} '
    found = [x for x in text.splitlines() if x.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_a_clients_requests_past_its_share_are_429_and_another_clients_go_through(host: Host) -> None:
    rid, lid = lease(host, A)
    bob_rid, bob_lid = lease(host, B)
    host.fake.act_gate = threading.Event()
    cap = SPARE_REQUESTS + REQUESTS_PER_LEASE * 1  # alice holds one replica
    flood = cap + 6
    with ThreadPoolExecutor(flood) as pool:
        futures = [pool.submit(step, host, A, rid, lid, f"a{i}") for i in range(flood)]
        wait_for(lambda: sum(f.done() for f in futures) >= flood - cap)  # the ones past her share, answered at once
        early = [f for f in futures if f.done()]
        refused = [f.result() for f in early]
        assert len(refused) == flood - cap and {r.status_code for r in refused} == {429}
        body = refused[0].json()
        assert body["kind"] == "throttled" and f"({cap})" in body["error"], body
        assert refused[0].headers["Retry-After"] == "1"
        # bob is not alice: his lease and his step (a replica of his own) are served meanwhile
        assert lease(host, B)[0] != rid
        bob = pool.submit(step, host, B, bob_rid, bob_lid, "b1")
        wait_for(lambda: in_use(host, "bob", "requests") == 1 or bob.done())
        assert not bob.done()  # admitted: under way (the fake's gate holds every replica's act), not refused
        host.fake.act_gate.set()
        assert bob.result().status_code == 200
        assert [f.result().status_code for f in futures if f not in early] == [200] * cap


def _raw_post(url: str, path: str, token: str, length: int) -> socket.socket:
    """A POST whose body is announced and not sent yet (the caller sends it, or not)."""
    port = int(url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    s.sendall(head.encode())
    return s


def _answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed without an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    while len(rest) < int(headers.get("content-length", "0")):
        chunk = s.recv(65536)
        assert chunk, "closed in the middle of the answer's body"
        rest += chunk
    return int(lines[0].split(" ")[1]), headers, rest


def test_bodies_past_a_clients_share_are_refused_unread(host: Host) -> None:
    rid, lid = lease(host, A)
    share = 4 * BODY_LIMIT  # osfleet.api.admission.BODY_SHARE bodies of the server's limit
    held = [_raw_post(host.url, f"/v1/replicas/{rid}/step", ALICE, BODY_LIMIT) for _ in range(share // BODY_LIMIT)]
    try:
        wait_for(lambda: in_use(host, "alice", "body_bytes") == share)  # all four admitted, waiting for their bodies
        over = _raw_post(host.url, f"/v1/replicas/{rid}/step", ALICE, BODY_LIMIT)
        status, headers, rest = _answer(over)
        assert status == 429 and headers.get("retry-after") == "1" and headers.get("connection") == "close"
        assert "bytes of bodies" in rest.decode(), rest
        over.close()
        # bob's body is his own share
        r = httpx.post(f"{host.url}/v1/leases", json={"holder": "b"}, headers=B, timeout=30)
        assert r.status_code == 201
    finally:
        for s in held:
            s.close()


def test_a_body_queued_behind_the_same_clients_request_on_a_replica_is_not_read(host: Host) -> None:
    rid, lid = lease(host, A)
    host.fake.act_gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(step, host, A, rid, lid, "first")
        assert host.fake.acting.wait(20)  # the first step holds the replica
        body = json.dumps({"lease_id": lid, "action_id": "second", "actions": WAIT, "observe": False}).encode()
        padded = body + b" " * (BODY_LIMIT - len(body))  # JSON allows trailing white space
        s = _raw_post(host.url, f"/v1/replicas/{rid}/step", ALICE, len(padded))
        s.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # as much as the other end takes in 3 s
            with contextlib.suppress(BlockingIOError):
                sent += s.send(padded[sent : sent + 65536])
                continue
            time.sleep(0.05)
        # read by the server, all 32 MiB would have gone at once; unread, the kernel's buffers take a few MiB
        assert sent < BODY_LIMIT // 2, f"{sent} bytes of a queued request's body were taken in"
        host.fake.act_gate.set()
        assert first.result().status_code == 200
        s.setblocking(True)
        s.sendall(padded[sent:])  # its turn: now it is read, and served
        status, _, _ = _answer(s)
        assert status == 200
        s.close()


def test_a_clients_evaluations_past_its_share_are_429_and_another_clients_run(host: Host) -> None:
    a1, la1 = lease(host, A)
    a2, la2 = lease(host, A)
    b1, lb1 = lease(host, B)
    for rid, lid, who in ((a1, la1, A), (a2, la2, A), (b1, lb1, B)):
        r = httpx.post(f"{host.url}/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=who)
        assert r.status_code == 200, r.text
    host.fake.shell_gate = threading.Event()

    def evaluate(rid: str, lid: str, who: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{host.url}/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=who, timeout=60)

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(evaluate, a1, la1, A)
        assert host.fake.shelling.wait(20)  # alice's evaluation is under way: her one slot is taken
        second = evaluate(a2, la2, A)
        assert second.status_code == 429 and second.json()["kind"] == "throttled"
        assert "evaluation" in second.json()["error"] and second.headers["Retry-After"] == "5"
        bobs = pool.submit(evaluate, b1, lb1, B)  # bob's is admitted and runs beside hers
        wait_for(lambda: in_use(host, "bob", "evaluations") == 1 or bobs.done())
        assert not bobs.done()  # under way (at the fake's gate), not refused
        host.fake.shell_gate.set()
        assert first.result().status_code == 200 and bobs.result().status_code == 200
    assert evaluate(a2, la2, A).status_code == 200  # her slot is free again
