"""The guest's resident helper and the host's side of its control port, without VMs: the helper's request
handling, its loop over a real socket pair, and the host's connections against a helper served on a real
UNIX socket (answers lost, repeated, refused, too long, late)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.errors import GuestTimeoutError
from osfleet.replicas import guest_control, guest_helper
from osfleet.replicas.guest_control import ControlError, Ports

pytestmark = pytest.mark.unit


class Recorder(guest_helper.Guest):
    """The guest's side effects, recorded instead of applied."""

    def __init__(self) -> None:
        self.clock = 1_800_000_000.0
        self.calls: list[tuple[object, ...]] = []

    def set_time(self, seconds: float) -> None:
        self.clock = seconds
        self.calls.append(("time", seconds))

    def now(self) -> float:
        return self.clock

    def set_identity(self, hostname: str, machine_id: str, seed: bytes) -> None:
        self.calls.append(("identity", hostname, machine_id, seed))


def test_the_helper_applies_well_formed_requests_and_names_what_is_wrong_with_others() -> None:
    g = Recorder()
    assert guest_helper.handle(b"7 ping", g) == b"7 ok\n"
    assert guest_helper.handle(b"8 time 1800000100.5", g) == b"8 ok\n" and g.clock == 1800000100.5
    assert guest_helper.handle(b"9 adjust 2.5", g) == b"9 ok\n" and g.clock == 1800000103.0
    seed = "ab" * 32
    line = f"10 identity osfleet-1234 {'0' * 32} {seed} 1800000200".encode()
    assert guest_helper.handle(line, g) == b"10 ok\n"
    assert g.calls[-2] == ("identity", "osfleet-1234", "0" * 32, bytes.fromhex(seed)) and g.clock == 1800000200
    before = list(g.calls)
    for bad, why in [
        (b"11 identity ../etc/x " + b"0" * 32 + b" " + seed.encode() + b" 1800000200", b"malformed identity"),
        (b"12 identity h " + b"0" * 31 + b" " + seed.encode() + b" 1800000200", b"malformed identity"),
        (b"13 time 12", b"implausible time"),
        (b"14 adjust -1e7", b"implausible adjustment"),
        (b"15 reboot", b"unknown request"),
        (b"16 time soon", b"could not convert"),
    ]:
        answer = guest_helper.handle(bad, g)
        assert answer.startswith(bad.split()[0] + b" err ") and why in answer, answer
    assert guest_helper.handle(b"ping", g) == b"- err no sequence number\n"
    assert guest_helper.handle("17 ping \u00e9".encode(), g) == b"- err not ascii\n"
    assert g.calls == before  # nothing was applied for any of them


def test_the_helper_finds_its_port_by_name(tmp_path: Path) -> None:
    for entry, name in (("vport1p1", "org.qemu.guest_agent.0"), ("vport1p2", guest_helper.PORT_NAME)):
        (tmp_path / entry).mkdir()
        (tmp_path / entry / "name").write_text(name + "\n")
    assert guest_helper.find_port(str(tmp_path)) == "/dev/vport1p2"
    assert guest_helper.find_port(str(tmp_path / "none")) is None


class Stop(Exception):
    pass


def test_the_helper_loop_answers_each_line_once_and_waits_when_the_host_leaves() -> None:
    host, guest_end = socket.socketpair()
    g = Recorder()
    waits: list[float] = []

    def wait() -> None:  # the port reads empty: no host; the real helper sleeps until SIGIO
        waits.append(time.monotonic())
        raise Stop

    def run() -> None:
        os.set_blocking(guest_end.fileno(), False)
        with contextlib.suppress(Stop):
            guest_helper.serve(guest_end.fileno(), g, wait)

    t = threading.Thread(target=run)
    t.start()
    host.sendall(b"1 adjust 10\n")
    host.sendall(b"1 adjust 10\n2 ping\n")  # asked again (the host missed the answer): answered, not applied twice
    host.sendall(b"x" * 600)  # no request is that long: dropped
    got = b""
    while got.count(b"\n") < 3:
        got += host.recv(100)
    host.shutdown(socket.SHUT_WR)
    t.join(10)
    assert got == b"1 ok\n1 ok\n2 ok\n" and g.calls == [("time", 1_800_000_010.0)] and len(waits) == 1
    host.close()
    guest_end.close()


@pytest.fixture
def fake_guest(tmp_path: Path) -> Iterator[tuple[Path, list[bytes], list[str]]]:
    """A helper on a UNIX socket; ``script`` says what to do with each connection: ``drop`` (read a line,
    close without an answer), ``ok``, ``err``, ``long``, ``silent`` (never answer)."""
    path = tmp_path / "control.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    lines: list[bytes] = []
    script: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while True:
                    data = b""
                    while not data.endswith(b"\n"):
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    lines.append(data)
                    seq = data.split()[0]
                    what = script.pop(0) if script else "ok"
                    if what == "drop":
                        break
                    if what == "silent":
                        time.sleep(3)
                        break
                    reply = {"ok": b"ok", "err": b"err no such thing", "long": b"ok" + b"x" * 2000}[what]
                    conn.sendall(b"999 ok\n" + seq + b" " + reply + b"\n")  # an old answer first: skipped

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, lines, script
    server.close()


def test_the_host_keeps_one_connection_and_repeats_an_unanswered_request_with_the_same_number(
    fake_guest: tuple[Path, list[bytes], list[str]],
) -> None:
    path, lines, script = fake_guest
    ports = Ports()
    ports.request(path, "ping", timeout=5)
    ports.request(path, "ping", timeout=5)  # same connection
    script.append("drop")
    ports.request(path, "adjust 1.0", timeout=5)  # first answer lost: asked again on a new connection
    assert len(lines) == 4 and lines[2] == lines[3] and lines[2].split()[1:] == [b"adjust", b"1.0"]
    ports.close()


def test_the_host_refuses_err_answers_long_lines_and_silence(fake_guest: tuple[Path, list[bytes], list[str]]) -> None:
    path, _, script = fake_guest
    ports = Ports()
    script.append("err")
    with pytest.raises(ControlError, match="no such thing"):
        ports.request(path, "time 1800000000", timeout=5)
    script += ["long", "long"]
    with pytest.raises(ControlError, match="more than"):
        ports.request(path, "ping", timeout=5)
    script += ["silent", "silent"]
    started = time.monotonic()
    with pytest.raises(GuestTimeoutError):
        ports.request(path, "ping", timeout=1.0)
    assert time.monotonic() - started < 2.5
    with pytest.raises(ControlError, match="control port"):
        ports.request(path.with_name("nobody.sock"), "ping", timeout=1.0)
    ports.close()


def test_the_helper_digest_follows_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    digest = guest_control.helper_digest()
    assert len(digest) == 12 and "def serve" in guest_control.helper_source()
    monkeypatch.setattr(guest_control, "helper_source", lambda: "changed")
    assert guest_control.helper_digest() != digest
