"""osfleet's tunnels without a VM: the host's ``Mux`` and the guest's ``Relay`` (the very program the guest runs)
over a UNIX socket standing in for the virtio-serial channel, to real TCP servers on this machine's loopback
standing in for the guest's services; and what a hostile guest could send the host."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.replicas.guest_tunnel import CLOSE, DATA, HEADER, HELLO, MAX_PAYLOAD, OPEN, OPENED, Relay, frame
from osfleet.replicas.tunnels import (
    MAX_BUFFERED,
    Mux,
    Stream,
    TunnelError,
    TunnelNotFoundError,
    TunnelRefusedError,
)

pytestmark = pytest.mark.integration  # real sockets and servers; ~20 s in sum, over the unit tier's budget

RELAY_ALONE_SECONDS = 0.5  # each test's channel is a socket of its own: an empty read there is its end


class Channel:
    """A UNIX socket the host's ``Mux`` connects to; ``start_relay`` runs the guest's relay on the other end.

    A relay reads a file descriptor number, not a socket object: ``close`` ends every relay before it closes the
    sockets they read, or a relay left running would read the next test's socket once that number is reused (two
    relays then split one channel's frames between them)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "tunnel.sock"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(1)
        self.guest: socket.socket | None = None
        self.guests: list[socket.socket] = []
        self.relays: list[threading.Thread] = []
        self.starts = 0
        self._accepting = threading.Lock()

    def accept(self) -> socket.socket:
        with self._accepting:  # a test's helper thread and start_relay may both ask for the guest's end
            if self.guest is None:
                self.guest, _ = self.listener.accept()
                self.guests.append(self.guest)
            return self.guest

    def start_relay(self) -> None:
        self.starts += 1
        guest = self.accept()
        relay = threading.Thread(target=Relay(guest.fileno()).serve, args=(RELAY_ALONE_SECONDS,), daemon=True)
        relay.start()
        self.relays.append(relay)

    def close(self) -> None:
        self.listener.close()
        for guest in self.guests:
            with contextlib.suppress(OSError):
                guest.shutdown(socket.SHUT_RDWR)  # the relay reads its end, then ends alone
        for relay in self.relays:
            relay.join(RELAY_ALONE_SECONDS + 5)
            assert not relay.is_alive(), "a guest relay outlived its channel"
        for guest in self.guests:
            guest.close()


def echo_server() -> tuple[socket.socket, int]:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return

            def echo(c: socket.socket = conn) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Channel]:
    ch = Channel(tmp_path)
    yield ch
    ch.close()


def connected(ch: Channel) -> Mux:
    mux = Mux(ch.path, ch.start_relay)
    threading.Thread(target=ch.accept, daemon=True).start()
    mux.connect()
    return mux


def new_stream(mux: Mux, port: int) -> Stream:
    return mux.open(port, lambda conn: Stream(f"t-{conn}", conn, port, "r-1", 0, "l-1", mux))


def drain(stream: Stream, n: int) -> bytes:
    out = b""
    deadline = time.monotonic() + 20
    while len(out) < n and time.monotonic() < deadline:
        got = stream.take(n - len(out), 1.0)
        assert got is not None, stream.closed
        out += got
    return out


def test_bytes_go_both_ways_on_several_connections_at_once(channel: Channel) -> None:
    srv, port = echo_server()
    mux = connected(channel)
    try:
        assert channel.starts == 1  # no relay answered the first hello: one was started
        streams = [new_stream(mux, port) for _ in range(3)]
        payloads = [bytes([i]) * (3 * MAX_PAYLOAD + 17) for i in range(3)]  # several frames each
        for s, p in zip(streams, payloads, strict=True):
            mux.send(s, p)
        for s, p in zip(streams, payloads, strict=True):
            assert drain(s, len(p)) == p
    finally:
        mux.close("test over")
        srv.close()


def test_a_port_nothing_listens_on_is_refused_and_a_closed_service_ends_the_stream(channel: Channel) -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()
    mux = connected(channel)
    try:
        with pytest.raises(TunnelRefusedError, match=str(closed_port)):
            new_stream(mux, closed_port)
        srv = socket.create_server(("127.0.0.1", 0))
        port = srv.getsockname()[1]
        stream = new_stream(mux, port)
        conn, _ = srv.accept()
        conn.sendall(b"bye")
        conn.close()
        assert drain(stream, 3) == b"bye"
        assert stream.take(10, 5.0) is None and stream.closed  # over, and read to its end
        srv.close()
    finally:
        mux.close("test over")


def test_a_channel_that_ended_ends_its_streams_and_a_new_one_works(channel: Channel) -> None:
    srv, port = echo_server()
    mux = connected(channel)
    first = new_stream(mux, port)
    mux.close("the replica's VM went away")
    assert first.closed == "the replica's VM went away"  # every stream of a channel ends with it
    with pytest.raises(TunnelNotFoundError):
        mux.send(first, b"late")
    channel.guest = None  # a new VM: a new channel, and its relay started anew
    mux2 = Mux(channel.path, channel.start_relay)
    try:
        threading.Thread(target=channel.accept, daemon=True).start()
        mux2.connect()
        assert channel.starts == 2
        s = new_stream(mux2, port)
        mux2.send(s, b"again")
        assert drain(s, 5) == b"again"
    finally:
        mux2.close("test over")
        srv.close()


def test_a_hostile_guest_cannot_flood_the_host_or_speak_for_other_streams(channel: Channel) -> None:
    mux = Mux(channel.path, lambda: None)
    guest_side: list[socket.socket] = []

    def fake_guest() -> None:
        g = channel.accept()
        guest_side.append(g)
        buf = b""
        while len(buf) < HEADER.size + 16:
            buf += g.recv(4096)
        kind, _, length = HEADER.unpack_from(buf)
        assert kind == HELLO
        g.sendall(frame(HELLO, 0, buf[HEADER.size : HEADER.size + length]))
        try:
            while True:  # answer every OPEN with OPENED
                head = g.recv(HEADER.size)
                if len(head) < HEADER.size:
                    return
                kind, conn, length = HEADER.unpack(head)
                if length:
                    g.recv(length)
                if kind == OPEN:
                    g.sendall(frame(OPENED, conn))
        except OSError:  # the host ended the channel (the test's point): this guest is done
            return

    threading.Thread(target=fake_guest, daemon=True).start()
    mux.connect()
    stream = new_stream(mux, 1234)
    g = guest_side[0]
    g.sendall(frame(DATA, 999, b"not yours") + frame(CLOSE, 998))  # ids the host never gave: ignored
    chunk = b"x" * MAX_PAYLOAD
    for _ in range(MAX_BUFFERED // MAX_PAYLOAD + 2):  # more than the client may leave unread
        g.sendall(frame(DATA, stream.conn, chunk))
    deadline = time.monotonic() + 10
    while stream.closed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stream.closed and "unread" in stream.closed and not stream.buffer
    g.sendall(struct.pack(">BII", DATA, stream.conn, MAX_PAYLOAD + 1))  # a frame over the limit
    deadline = time.monotonic() + 10
    while mux.dead is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mux.dead and "frame" in mux.dead
    with pytest.raises((TunnelError, TunnelNotFoundError)):
        new_stream(mux, 1234)
    g.close()
