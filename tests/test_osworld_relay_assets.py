"""osfleet.osworld's two bridges for OSWorld's host-side code: VLC's HTTP port relayed request by request into the
guest (``guest_http``), and osfleet's asset URLs answered in the harness's process (``assets``).

The relay's guest half (``RELAY_SCRIPT``) really runs here, with python3 against a real HTTP server on the
loopback standing in for the guest's VLC; the answers a guest could forge are fed to the parser directly."""

from __future__ import annotations

import base64
import hashlib
import http.client
import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from osfleet.osworld import assets
from osfleet.osworld.guest_http import MAX_ANSWER_BYTES, GuestHttpRelay, GuestRefused, parse_answer
from osfleet.tasks.assets import AssetStore


@dataclass
class Ran:
    exit_code: int
    stdout: str
    stderr: str


class LocalShell:
    """The guest's shell, here: runs the command with sh and records it."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def __call__(self, command: str, timeout: float, what: str) -> Ran:
        self.commands.append(command)
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return Ran(p.returncode, p.stdout, p.stderr)


class _Vlc(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get("Authorization") != "Basic " + base64.b64encode(b":password").decode():
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = f"<root><path>{self.path}</path></root>".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/xml; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def vlc() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vlc)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read()
    finally:
        conn.close()


@pytest.mark.system
def test_the_relay_answers_as_the_guest_service_does(vlc: int) -> None:
    shell = LocalShell()
    relay = GuestHttpRelay(shell, vlc).start()
    try:
        auth = {"Authorization": "Basic " + base64.b64encode(b":password").decode()}
        assert get(relay.port, "/requests/status.xml?command=pl_pause", auth) == (
            200,
            "text/xml; charset=UTF-8",
            b"<root><path>/requests/status.xml?command=pl_pause</path></root>",
        )
        assert get(relay.port, "/requests/status.xml")[0] == 401  # the service's own refusal, passed on
        assert len(shell.commands) == 2  # one guest command per request
    finally:
        relay.stop()


@pytest.mark.system
def test_nothing_listening_in_the_guest_is_a_connection_error_as_at_a_closed_port(vlc: int) -> None:
    probe = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vlc)
    closed = int(probe.server_address[1])
    probe.server_close()  # a port nothing listens on
    relay = GuestHttpRelay(LocalShell(), closed).start()
    try:
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{relay.port}/requests/status.xml", timeout=60)
    finally:
        relay.stop()


@pytest.mark.unit
def test_a_large_request_body_is_refused_without_asking_the_guest(vlc: int) -> None:
    shell = LocalShell()
    relay = GuestHttpRelay(shell, vlc).start()
    try:
        r = requests.post(f"http://127.0.0.1:{relay.port}/x", data=b"x" * (1 << 20), timeout=60)
        assert r.status_code == 413 and shell.commands == []
    finally:
        relay.stop()


@pytest.mark.unit
@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "not json",
        "[1, 2]",
        '{"status": "200", "body": ""}',
        '{"status": 99, "body": ""}',
        '{"status": true, "body": ""}',
        '{"status": 200, "body": "!!not base64!!"}',
        '{"status": 200, "content_type": "a\\nb", "body": ""}',
        '{"status": 200, "body": "' + "A" * (MAX_ANSWER_BYTES * 2) + '"}',
        '{"refused": "Connection refused"}',
    ],
)
def test_what_a_guest_answers_is_checked_before_it_is_passed_on(stdout: str) -> None:
    with pytest.raises(GuestRefused):
        parse_answer(stdout, 0)


@pytest.mark.unit
def test_a_failed_relay_command_is_no_answer() -> None:
    with pytest.raises(GuestRefused):
        parse_answer('{"status": 200, "body": ""}', 1)


# --- osfleet's asset URLs in the harness's process ------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[None]:
    assets.install()
    try:
        yield
    finally:
        assets.uninstall()


@pytest.mark.unit
def test_a_shipped_bundles_asset_is_served_byte_for_byte(served: None) -> None:
    url, path = next(iter(sorted(assets.shipped_assets().items())))
    r = requests.get(url, stream=True, timeout=10)
    r.raise_for_status()
    got = b"".join(r.iter_content(8192))
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()
    assert int(r.headers["Content-Length"]) == len(got)


@pytest.mark.unit
def test_the_hosts_asset_store_is_read_too(served: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))
    file = tmp_path / "data.bin"
    file.write_bytes(b"\x00\x01 mine")
    AssetStore.from_settings().add("https://assets.osfleet.invalid/mine/data.bin", file)
    assert requests.get("https://assets.osfleet.invalid/mine/data.bin", timeout=10).content == b"\x00\x01 mine"


@pytest.mark.unit
def test_an_unknown_asset_is_404_and_other_urls_go_to_the_network(served: None, vlc: int) -> None:
    r = requests.get("https://assets.osfleet.invalid/nothing/here.txt", timeout=10)
    assert r.status_code == 404 and "not an osfleet asset" in r.text
    # a URL no asset answers reaches the network as before (here: a server on the loopback)
    r = requests.get(f"http://127.0.0.1:{vlc}/requests/status.xml", auth=("", "password"), timeout=10)
    assert r.status_code == 200 and b"/requests/status.xml" in r.content


@pytest.mark.unit
def test_any_url_the_asset_store_holds_is_answered_offline(
    served: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))
    file = tmp_path / "expected.xlsx"
    file.write_bytes(b"PK\x03\x04 expected")
    url = "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/x/expected.xlsx"
    AssetStore.from_settings().add(url, file)  # what 'osfleet tasks assets fetch' leaves for a Verified task
    assert requests.get(url, timeout=10).content == b"PK\x03\x04 expected"  # never sent to the network


@pytest.mark.unit
def test_install_is_idempotent_and_uninstall_puts_requests_back() -> None:
    original = requests.Session.__init__
    assets.install()
    assets.install()
    assets.uninstall()
    assert requests.Session.__init__ is original
    assert json.loads(json.dumps(sorted(assets.shipped_assets())))  # the shipped suite has assets
