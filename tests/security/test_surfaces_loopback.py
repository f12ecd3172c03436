"""Red team: the loopback servers osfleet runs for a lease or a host, tried from another user of the machine and
from a browser page.

- OSWorld's in-VM protocol server of a lease (``osfleet.osworld.server``) and its VLC relay: whoever uses them acts
  as the desktop user of the replica, so only the process that leased it (or one holding the lease's secret) may,
  and no browser page (an ``Origin``, or another site's name in ``Host``);
- a forwarded port (``osfleet.client.PortForward``, Chrome's DevTools for OSWorld): another user's connection is
  closed before a tunnel is opened for it;
- a host agent's ``/metrics``: a token (the operator's, or the metrics token) from loopback too; a browser page of
  another site refused even with one.

The other user is real: ``nobody``, through ``setpriv``, with Debian's own Python, sending what an attacker would.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from osfleet.api.app import create_app
from osfleet.client.forward import PortForward
from osfleet.config import AgentConfig
from osfleet.osworld.endpoints import Endpoints
from osfleet.osworld.guest_http import GuestHttpRelay
from osfleet.osworld.server import ProtocolServer
from tests.fakes import FakeHost
from tests.test_fleet import free_port
from tests.test_osworld_provider import FakeDesktop

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
# Run as another user: the HTTP status of a GET with the headers given (0: the connection closed unanswered).
GET = textwrap.dedent(
    """
    import json, sys, urllib.error, urllib.request
    url, headers = sys.argv[1], json.loads(sys.argv[2])
    try:
        print(urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20).status)
    except urllib.error.HTTPError as e:
        print(e.code)
    except OSError:
        print(0)
    """
)


def as_nobody(url: str, headers: dict[str, str] | None = None) -> int:
    out = subprocess.run(
        [*NOBODY, "/usr/bin/python3", "-c", GET, url, json.dumps(headers or {})],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-1500:]
    return int(out.stdout.strip())


def here(url: str, headers: dict[str, str] | None = None) -> int:
    """The same GET from this very process."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=20) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def protocol(tmp_path: Path) -> Iterator[ProtocolServer]:
    with ProtocolServer(Endpoints(FakeDesktop(tmp_path))) as server:
        yield server


@pytest.mark.system
def test_osworlds_protocol_server_answers_only_its_own_process(protocol: ProtocolServer) -> None:
    url = f"http://127.0.0.1:{protocol.port}/platform"
    assert here(url) == 200  # OSWorld's controllers: in the process that leased the replica, no credentials
    assert as_nobody(url) == 401  # another user of the machine
    assert as_nobody(url, {"Authorization": "Bearer not-the-secret"}) == 401
    assert as_nobody(url, {"Authorization": f"Bearer {protocol.secret}"}) == 200  # a tool given the lease's secret
    basic = base64.b64encode(f"osfleet:{protocol.secret}".encode()).decode()
    assert as_nobody(url, {"Authorization": f"Basic {basic}"}) == 200


@pytest.mark.integration
def test_osworlds_protocol_server_refuses_a_browser_page(protocol: ProtocolServer) -> None:
    url = f"http://127.0.0.1:{protocol.port}/platform"
    assert here(url, {"Origin": "https://evil.example"}) == 403  # even from this process, even same-site
    assert here(url, {"Origin": f"http://127.0.0.1:{protocol.port}"}) == 403
    assert here(url, {"Host": f"evil.example:{protocol.port}"}) == 403  # a page that rebound its name to 127.0.0.1


@pytest.mark.system
def test_the_vlc_relay_answers_only_its_own_process(tmp_path: Path) -> None:
    desktop = FakeDesktop(tmp_path)
    endpoints = Endpoints(desktop)
    relay = GuestHttpRelay(endpoints.shell, 8080).start()
    try:
        url = f"http://127.0.0.1:{relay.port}/requests/status.xml"
        assert as_nobody(url) == 401 and desktop.actions == []  # refused before anything reached the guest
        assert here(url, {"Origin": "https://evil.example"}) == 403 and desktop.actions == []
    finally:
        relay.stop()


class Tunnels:
    """A session's four tunnel calls, recording what was opened (nothing should be, for another user)."""

    def __init__(self) -> None:
        self.opened: list[int] = []

    def open_tunnel(self, port: int) -> str:
        self.opened.append(port)
        return "t-1"

    def tunnel_send(self, tunnel_id: str, data: bytes) -> None:
        pass

    def tunnel_receive(self, tunnel_id: str, *, wait: float = 20.0) -> bytes | None:
        time.sleep(0.05)
        return b""

    def close_tunnel(self, tunnel_id: str) -> None:
        pass


# Run as another user: connect, ask, and print how many bytes came back before the connection ended (0: closed).
CONNECT = textwrap.dedent(
    """
    import socket, sys
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
    try:
        s.sendall(b"GET /json HTTP/1.1\\r\\n\\r\\n")
        print(len(s.recv(100)))
    except ConnectionError:
        print(0)
    """
)


@pytest.mark.system
def test_a_forwarded_port_closes_another_users_connection_before_any_tunnel() -> None:
    session = Tunnels()
    forward = PortForward(session, 1337)
    try:
        out = subprocess.run(
            [*NOBODY, "/usr/bin/python3", "-c", CONNECT, str(forward.port)],
            capture_output=True, text=True, timeout=60, cwd="/",
        )  # fmt: skip
        assert out.returncode == 0 and out.stdout.strip() == "0", out  # closed: nothing came back
        assert session.opened == []
        with socket.create_connection(("127.0.0.1", forward.port), timeout=10):  # this user's: a tunnel
            deadline = time.monotonic() + 10
            while not session.opened and time.monotonic() < deadline:
                time.sleep(0.02)
        assert session.opened == [1337]
    finally:
        forward.stop()


OPERATOR, METRICS = "operator-token-0123456789", "prometheus-token-0123456789"


@pytest.fixture
def host(tmp_path: Path) -> Iterator[str]:
    config = AgentConfig(token=OPERATOR, warm=0, metrics_token=METRICS)
    port = free_port()
    app = create_app(config, lambda: FakeHost(tmp_path / "h", ready=0))
    server = uvicorn.Server(uvicorn.Config(app, "127.0.0.1", port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.system
def test_a_host_agents_metrics_need_a_token_from_loopback_too(host: str) -> None:
    url = f"{host}/metrics"
    assert here(url) == 401  # loopback is no credential: another user, or a page, reaches it too
    assert as_nobody(url) == 401
    assert here(url, {"Authorization": f"Bearer {METRICS}"}) == 200
    assert here(url, {"Authorization": f"Bearer {OPERATOR}"}) == 200
    assert here(f"{host}/v1/replicas", {"Authorization": f"Bearer {METRICS}"}) == 401  # it reads /metrics only
    page = {"Authorization": f"Bearer {OPERATOR}", "Origin": "https://evil.example"}
    assert here(url, page) == 403  # a page of another site, whatever it sends
    assert here(url, {"Authorization": f"Bearer {METRICS}", "Origin": host}) == 200  # this server's own page
