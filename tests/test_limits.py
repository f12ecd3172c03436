"""Bounded before read, and never starved (no VM: real uvicorn servers on loopback over the test fakes): a body over
the limit is refused with 413 before it is read and before auth, on the host agent, the gateway (its step fast
path included) and the login form; a streamed body is cut at the limit; ``/health`` and ``/v1/host`` answer while
every worker thread is held by a step."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest
import uvicorn
from fastapi import FastAPI

from osfleet.api.app import create_app
from osfleet.api.limits import size_thread_pool
from osfleet.config import AgentConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.fakes import FakeHost

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.
pytestmark = pytest.mark.integration

TOKEN = "limits-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: FastAPI) -> Server:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    return Server(port, server, thread)


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "home", ready=1)


@pytest.fixture
def agent(fake: FakeHost) -> Iterator[Server]:
    s = serve(create_app(AgentConfig(token=TOKEN, warm=0, max_body_bytes=LIMIT), lambda: fake))
    yield s
    s.stop()


def raw(port: int, head: str, body: bytes = b"", read_seconds: float = 5) -> tuple[bytes, int]:
    """Send ``head`` (and ``body``) on a raw socket; (what the server answered, body bytes it took before it
    answered and closed). A server that reads a body it refuses would leave the send blocked or the answer late."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_seconds) as s:
        s.sendall(head.encode())
        sent = 0
        s.setblocking(False)
        answer = b""
        deadline = time.monotonic() + read_seconds
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
                if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                    break
            except BlockingIOError:
                pass
            if sent < len(body):
                try:
                    sent += s.send(body[sent : sent + 65536])
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    time.sleep(0.001)
            else:
                time.sleep(0.005)
        return answer, sent


def post_head(path: str, length: int, auth: bool = False, extra: str = "") -> str:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", f"Content-Length: {length}"]
    if auth:
        lines.append(f"Authorization: Bearer {TOKEN}")
    return "\r\n".join(lines) + "\r\n" + extra + "\r\n"


@pytest.mark.parametrize("auth", [False, True])
def test_a_declared_body_over_the_limit_is_refused_unread_before_auth(
    agent: Server, fake: FakeHost, auth: bool
) -> None:
    start = time.monotonic()
    answer, _ = raw(agent.port, post_head("/v1/leases", 100 * 2**20, auth))  # 100 MB declared, none sent
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert time.monotonic() - start < 3  # answered at once, without waiting for the body
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body == {"error": f"the request body is over this server's limit of {LIMIT} bytes", "kind": "too_large"}
    assert fake.get(fake.replicas()[0].id).lease is None  # nothing was leased


def test_a_streamed_body_is_cut_at_the_limit(agent: Server, fake: FakeHost) -> None:
    chunk = b"x" * 16384
    stream = b"".join(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(64))  # 1 MiB, chunked
    head = "\r\n".join(
        ["POST /v1/leases HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", "Transfer-Encoding: chunked"]
    )
    answer, sent = raw(agent.port, head + f"\r\nAuthorization: Bearer {TOKEN}\r\n\r\n", stream)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["kind"] == "too_large"
    assert fake.get(fake.replicas()[0].id).lease is None


def test_a_body_under_the_limit_is_served(agent: Server) -> None:
    r = httpx.post(f"{agent.url}/v1/leases", json={"holder": "x" * 100}, headers=AUTH, timeout=10)
    assert r.status_code == 201


def test_the_gateway_and_its_step_fast_path_refuse_a_large_body_unread(agent: Server) -> None:
    gw = serve(
        create_gateway(
            "gateway-own-token-0123456789",
            [HostEntry(name="h1", url=agent.url, token=TOKEN)],
            max_body_bytes=LIMIT,
        )
    )
    try:
        for path in ("/v1/replicas/h1.r-1/step", "/v1/leases", "/reset"):
            answer, _ = raw(gw.port, post_head(path, 100 * 2**20))
            assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])
        body = json.dumps(
            {"lease_id": "h1.l", "action_id": "a", "actions": [{"type": "type", "text": "x" * 9000}] * 10}
        )
        r = httpx.post(
            f"{gw.url}/v1/replicas/h1.r-1/step",
            content=body,
            headers={"Authorization": "Bearer gateway-own-token-0123456789", "Content-Type": "application/json"},
            timeout=10,
        )
        assert r.status_code == 413 and r.json()["kind"] == "too_large"  # an honest length over the limit
    finally:
        gw.stop()


def test_the_login_form_reads_at_most_a_few_kilobytes(agent: Server) -> None:
    answer, _ = raw(
        agent.port, post_head("/ui/login", 10 * 2**20).replace("application/json", "application/x-www-form-urlencoded")
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


# --- health answers while steps hold every thread ----------------------------------------------------------------
def test_health_and_the_host_sample_answer_while_steps_hold_every_worker_thread(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path / "home", ready=1, max_replicas=4)  # a pool of anyio's default 40 threads
    fake.act_gate = threading.Event()
    s = serve(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake))
    steps = 60  # more long steps than worker threads: every thread is held, some steps wait for one
    try:
        lease = httpx.post(f"{s.url}/v1/leases", json={}, headers=AUTH, timeout=10).json()
        rid, lid = lease["replica_id"], lease["lease_id"]

        def step(i: int) -> int:
            body = {
                "lease_id": lid,
                "action_id": f"a{i}",
                "actions": [{"type": "wait", "seconds": 0}],
                "observe": False,
            }
            return httpx.post(f"{s.url}/v1/replicas/{rid}/step", json=body, headers=AUTH, timeout=120).status_code

        with ThreadPoolExecutor(steps) as pool:
            futures = [pool.submit(step, i) for i in range(steps)]
            try:
                assert fake.acting.wait(30)
                time.sleep(1)  # let the other steps take every worker thread (they queue behind the first)
                for path, headers in (("/health", {}), ("/v1/host", AUTH), ("/metrics", AUTH)):
                    start = time.monotonic()
                    r = httpx.get(f"{s.url}{path}", headers=headers, timeout=5)
                    assert r.status_code == 200 and time.monotonic() - start < 2, path
            finally:
                fake.act_gate.set()
            assert sorted(f.result() for f in futures) == [200] * steps
    finally:
        s.stop()


def test_the_thread_pool_is_sized_to_the_replicas_a_host_holds() -> None:
    async def sized(replicas: int) -> tuple[int, int]:
        return size_thread_pool(replicas), int(anyio.to_thread.current_default_thread_limiter().total_tokens)

    assert anyio.run(sized, 4) == (40, 40)  # never fewer than anyio's default
    assert anyio.run(sized, 330) == (676, 676)  # two per replica and some to spare
