"""A stranger cannot make the gateway or a host agent take in a body: a request without a valid token is refused
401 from its headers, before a byte of its body is read — on the gateway's step fast path, on every other route
of the gateway and the host (FastAPI reads a route's body before it runs the route's auth dependency), and on
OSGym's endpoints unless the address is allow-listed.

Proof on the wire: each attack declares an 8 MiB body (under the 16 MiB limit, so ``BodyLimit`` lets it pass),
sends only its first 64 KiB and waits for an answer. A server that buffers before it authenticates waits for
the rest and never answers (the read times out); one that authenticates first answers 401 at once."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.config import AgentConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from tests.fakes import FakeHost

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.
pytestmark = pytest.mark.integration

OPERATOR = "operator-token-0123456789"
ALICE = "alice-token-0123456789"
DECLARED = 8 * 2**20
SENT = 64 * 1024
ANSWER_SECONDS = 10.0


def partial_post(url: str, path: str, headers: dict[str, str], wait: float = ANSWER_SECONDS) -> str:
    """POST ``path`` declaring ``DECLARED`` bytes, send ``SENT`` of them, return the status line ('' if none)."""
    parts = urlsplit(url)
    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json"]
    lines += [f"Content-Length: {DECLARED}", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection((parts.hostname, parts.port), timeout=wait) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + b" " * SENT)
        try:
            head = s.recv(4096).decode(errors="replace")
        except TimeoutError:
            return ""
    return head.split("\r\n", 1)[0]


@pytest.fixture
def host_url(tmp_path: Path, served: Callable[..., str]) -> str:
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\n")
    config = AgentConfig(token=OPERATOR, warm=0, clients=load_clients(clients, OPERATOR))
    return served(create_app(config, lambda: FakeHost(tmp_path / "home", ready=1)))


@pytest.fixture
def gateway_url(host_url: str, tmp_path: Path, served: Callable[..., str]) -> str:
    clients = tmp_path / "gw-clients"
    clients.write_text(f"alice {ALICE}\n")
    entry = HostEntry(name="h1", url=host_url, token=OPERATOR)
    token = "gateway-token-0123456789"
    return served(create_gateway(token, [entry], clients=load_clients(clients, token)))


STRANGERS = [{}, {"Authorization": "Bearer not-a-token-0123456789"}, {"Authorization": "Basic YWxpY2U6eA=="}]


@pytest.mark.parametrize("headers", STRANGERS, ids=["no-token", "wrong-token", "not-bearer"])
def test_the_gateways_step_fast_path_refuses_a_strangers_body_unread(gateway_url: str, headers: dict[str, str]) -> None:
    assert partial_post(gateway_url, "/v1/replicas/h1.r-00000000/step", headers) == "HTTP/1.1 401 Unauthorized"


@pytest.mark.parametrize("path", ["/v1/leases", "/v1/replicas/h1.r-00000000/reset", "/reset", "/step"])
def test_every_gateway_route_refuses_a_strangers_body_unread(gateway_url: str, path: str) -> None:
    assert partial_post(gateway_url, path, {}) == "HTTP/1.1 401 Unauthorized"


@pytest.mark.parametrize("path", ["/v1/leases", "/v1/replicas/r-00000000/step", "/v1/replicas", "/reset"])
def test_every_host_route_refuses_a_strangers_body_unread(host_url: str, path: str) -> None:
    assert partial_post(host_url, path, {"Authorization": "Bearer not-a-token-0123456789"}) == (
        "HTTP/1.1 401 Unauthorized"
    )


def test_a_bad_acting_for_header_is_refused_unread_too(host_url: str) -> None:
    headers = {"Authorization": f"Bearer {OPERATOR}", "X-Osfleet-Client": "no spaces allowed"}
    assert partial_post(host_url, "/v1/leases", headers) == "HTTP/1.1 401 Unauthorized"


def test_a_known_caller_is_still_read(host_url: str) -> None:
    """The refusal is about strangers: a client's partial body is waited for (the server reads it)."""
    assert partial_post(host_url, "/v1/leases", {"Authorization": f"Bearer {ALICE}"}, wait=2) == ""
