"""Red team: ``osfleet openenv serve`` spends its fleet token for whoever reaches its port, so it lets in only its
own user's processes on loopback and whoever presents its client token (``osfleet.serving_gate``); a browser page
(an ``Origin`` not allowed) is refused even with the token.

The other user is real: ``nobody``, through ``setpriv``, with Debian's own Python (the project's lives under
``/root``): plain HTTP and a raw WebSocket handshake from the standard library, as an attacker would send them.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from osfleet.peers import loopback_peer_uid, proc_address
from osfleet.serving_gate import ServingGate
from tests.test_client import TOKEN, agent, openenv_server, url_of  # noqa: F401 - agent is a fixture
from tests.test_fleet import Agent

CLIENT_TOKEN = "openenv-client-token-0123456789"

# Run as nobody: prints the HTTP status of GET /schema and of a WebSocket handshake on /ws, with the headers given.
PROBE = textwrap.dedent(
    """
    import json, socket, sys, urllib.error, urllib.request
    port, headers = int(sys.argv[1]), json.loads(sys.argv[2])
    req = urllib.request.Request(f"http://127.0.0.1:{port}/schema", headers=headers)
    try:
        http = urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        http = e.code
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    lines = ["GET /ws HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    s.sendall(("\\r\\n".join(lines) + "\\r\\n\\r\\n").encode())
    ws = int(s.recv(200).split(b" ")[1])
    print(http, ws)
    """
)


def probe(port: int, headers: dict[str, str], as_nobody: bool = True) -> tuple[int, int]:
    import json

    prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if as_nobody else []
    out = subprocess.run(
        [*prefix, "/usr/bin/python3", "-c", PROBE, str(port), json.dumps(headers)],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-1500:]
    http, ws = out.stdout.split()
    return int(http), int(ws)


@pytest.fixture
def served(agent: Agent, tmp_path: Path):  # type: ignore[no-untyped-def]  # noqa: F811
    token_file = tmp_path / "fleet-token"
    token_file.write_text(TOKEN + "\n")
    client_token = tmp_path / "client-token"
    client_token.write_text(CLIENT_TOKEN + "\n")
    with openenv_server(url_of(agent), token_file, tmp_path, "--client-token-file", str(client_token)) as port:
        yield port


@pytest.mark.system
def test_another_user_of_the_machine_needs_the_client_token(served: int) -> None:
    assert probe(served, {}) == (401, 401)
    assert probe(served, {"Authorization": "Bearer wrong"}) == (401, 401)
    assert probe(served, {"Authorization": f"Bearer {TOKEN}"}) == (401, 401)  # the fleet's token is not the key
    assert probe(served, {"Authorization": f"Bearer {CLIENT_TOKEN}"}) == (200, 101)
    basic = base64.b64encode(f"osfleet:{CLIENT_TOKEN}".encode()).decode()  # what http://osfleet:TOKEN@... sends
    assert probe(served, {"Authorization": f"Basic {basic}"}) == (200, 101)


@pytest.mark.system
def test_the_servers_own_user_on_loopback_needs_no_token(served: int) -> None:
    assert probe(served, {}, as_nobody=False) == (200, 101)


@pytest.mark.system
def test_a_browser_page_is_refused_even_with_the_token(served: int) -> None:
    evil = {"Origin": "https://evil.example", "Authorization": f"Bearer {CLIENT_TOKEN}"}
    assert probe(served, evil, as_nobody=False) == (403, 403)
    assert probe(served, {"Origin": f"http://127.0.0.1:{served}"}, as_nobody=False) == (200, 101)


@pytest.mark.system
def test_the_client_token_is_made_private_when_missing(agent: Agent, tmp_path: Path) -> None:  # noqa: F811
    token_file = tmp_path / "fleet-token"
    token_file.write_text(TOKEN + "\n")
    made = tmp_path / "made" / "openenv-token"
    with openenv_server(url_of(agent), token_file, tmp_path, "--client-token-file", str(made)) as port:
        token = made.read_text().strip()
        assert len(token) >= 32 and made.stat().st_mode & 0o777 == 0o600
        assert probe(port, {"Authorization": f"Bearer {token}"}) == (200, 101)


@pytest.mark.unit
def test_a_loopback_peer_is_known_by_its_socket_owner() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        conn, peer = server.accept()
        with client, conn:
            assert loopback_peer_uid(peer, server.getsockname()) == os.geteuid()
            assert loopback_peer_uid(("192.0.2.7", peer[1]), server.getsockname()) is None  # not loopback
            assert loopback_peer_uid((peer[0], 1), server.getsockname()) is None  # no such connection


@pytest.mark.unit
def test_addresses_are_spelt_as_proc_net_tcp_spells_them() -> None:
    assert proc_address("127.0.0.1", 8080) == "0100007F:1F90"
    assert proc_address("::1", 22) == "00000000000000000000000001000000:0016"


@pytest.mark.unit
def test_only_the_token_opens_the_gate() -> None:
    gate = ServingGate(lambda *a: None, "s3cret")  # type: ignore[arg-type, return-value]
    assert gate.token_given(b"Bearer s3cret") and gate.token_given(b"basic " + base64.b64encode(b"any:s3cret"))
    assert not gate.token_given(b"Bearer s3cre") and not gate.token_given(b"Basic !!!")
    assert not gate.token_given(b"Token s3cret") and not gate.token_given(None)
    assert gate.origin_allowed("http://127.0.0.1:8000", 8000) and gate.origin_allowed("http://localhost:8000", 8000)
    assert not gate.origin_allowed("http://127.0.0.1.evil.example", 8000)
    assert not gate.origin_allowed("http://127.0.0.1:8001", 8000)  # a page of another server of the machine


@pytest.mark.system  # starts processes
def test_openenvs_own_client_sends_a_token_in_its_url_as_basic() -> None:
    """What README tells OpenEnv users: the token in the URL, and OpenEnv's unchanged client presents it."""
    import asyncio
    import threading

    from openenv.core.env_client import EnvClient

    seen: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as server:

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                seen.append(conn.recv(4096))
                conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        port = server.getsockname()[1]

        async def connect() -> None:
            class Client(EnvClient):  # type: ignore[type-arg]  # what an OpenEnv user writes; never called here
                _step_payload = _parse_result = _parse_state = staticmethod(lambda payload: payload)

            client = Client(f"http://osfleet:{CLIENT_TOKEN}@127.0.0.1:{port}")
            with pytest.raises(ConnectionError):
                await client.connect()

        asyncio.run(connect())
        thread.join(10)
    headers = seen[0].decode("latin-1").lower()
    expected = base64.b64encode(f"osfleet:{CLIENT_TOKEN}".encode()).decode().lower()
    assert f"authorization: basic {expected}" in headers, headers
    assert CLIENT_TOKEN.lower() not in headers.split("\r\n")[0]  # not in the request line (paths end in logs)
