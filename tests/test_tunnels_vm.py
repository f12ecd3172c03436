"""Tunnels into real replicas (``osfleet host serve``, two replicas under TCG): a program on this machine reaches a
service on a replica's own loopback through ``Session.forward`` (bytes both ways, unchanged, over several frames);
a port nothing listens on is refused (409); a tunnel is its lease's and its replica's only (404 from another
session); a reset ends it, and a new connection after the reset works."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.bench.load import LocalAgent
from osfleet.client import ConflictError, Fleet, NotFoundError, Session
from osfleet.vm.images import GoldenImage
from tests.conftest import local_agent

pytestmark = pytest.mark.vm
ECHO_PORT = 7777
# A service of the guest's own: an echo server on its loopback, as the desktop user (python3-minimal suffices).
ECHO = (
    "import socket, threading\n"
    f"s = socket.create_server(('127.0.0.1', {ECHO_PORT}))\n"
    "def echo(c):\n"
    "    with c:\n"
    "        while (d := c.recv(65536)):\n"
    "            c.sendall(d)\n"
    "while True:\n"
    "    threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()\n"
)


@pytest.fixture(scope="module")
def agent(golden: GoldenImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAgent, Path]]:
    with local_agent(golden, tmp_path_factory.mktemp("tunnels"), 2) as served:
        yield served


def start_echo(s: Session) -> None:
    script = ECHO.replace("'", "'\\''")
    (r,) = s.step({"type": "shell", "command": f"nohup python3 -c '{script}' >/dev/null 2>&1 &"}, observe=False).results
    assert r.ok and r.exit_code == 0, r


def round_trip(port: int, data: bytes) -> bytes:
    deadline = time.monotonic() + 120
    while True:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
            c.sendall(data)
            got = b""
            try:
                while len(got) < len(data):
                    chunk = c.recv(1 << 20)
                    if not chunk:
                        break
                    got += chunk
            except OSError:
                pass
        if got or time.monotonic() > deadline:
            return got
        time.sleep(1)  # the echo server was not listening yet: the connection was refused in the guest


def test_a_forwarded_port_reaches_the_guests_own_service(agent: tuple[LocalAgent, Path]) -> None:
    a, _ = agent
    data = os.urandom(512 * 1024 + 3)  # many frames each way
    with Fleet(a.url, a.token) as fleet, fleet.lease(holder="tunnel-a") as s, fleet.lease(holder="tunnel-b") as other:
        start_echo(s)
        with s.forward(ECHO_PORT) as fwd:
            assert round_trip(fwd.port, data) == data
            assert round_trip(fwd.port, b"twice") == b"twice"  # a second connection, a second tunnel

        with pytest.raises(ConflictError, match="port 7778"):
            s.open_tunnel(7778)  # nothing listens there
        tunnel = s.open_tunnel(ECHO_PORT)
        with pytest.raises(NotFoundError):  # another replica's session: not its tunnel
            other.tunnel_send(tunnel, b"x")
        s.tunnel_send(tunnel, b"ping")
        assert s.tunnel_receive(tunnel, wait=20) == b"ping"

        s.reset()  # a new VM: its tunnels end, the echo server with it
        with pytest.raises(NotFoundError):
            s.tunnel_send(tunnel, b"after reset")
        start_echo(s)
        with s.forward(ECHO_PORT) as fwd:
            assert round_trip(fwd.port, b"after reset") == b"after reset"
