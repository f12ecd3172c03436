"""Red team: a guest that stops reading what a tunnel sends it.

The host's end of the tunnels (``osfleet.replicas.tunnels.Mux``) over a UNIX socket standing in for the virtio-serial
channel; the guest's end is a fake that answers the handshake and then never reads again, or the guest's real relay
(``osfleet.replicas.guest_tunnel.Relay``) in front of a service that never reads. Neither may hold the sender: a
send waits for room in its stream's bounded queue only until its deadline (then the stream ends, and the sender is
told why), whether it waits in a thread or on an event loop; a channel that takes nothing is given up; and in the
guest one service that does not read holds no other connection up.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.errors import OsfleetError
from osfleet.replicas import tunnels
from osfleet.replicas.guest_tunnel import HEADER, HELLO, OPEN, OPENED, frame
from osfleet.replicas.tunnels import Mux, Stream, TunnelError, Tunnels, TunnelStalledError
from tests.test_tunnels import Channel, connected, drain, echo_server, new_stream

pytestmark = pytest.mark.integration  # real sockets and threads; seconds of deadlines in sum

DEADLINE = 1.0  # a send's deadline in these tests (seconds); the channel's writer gives up after 3 of them


@pytest.fixture
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tunnels, "SEND_SECONDS", DEADLINE, raising=False)
    monkeypatch.setattr(tunnels, "WRITE_SECONDS", 3 * DEADLINE, raising=False)


@pytest.fixture
def deaf_guest(tmp_path: Path) -> Iterator[tuple[Mux, Stream]]:
    """A Mux whose guest answers the handshake and one OPEN, then never reads its channel again."""
    channel = Channel(tmp_path)
    mux = Mux(channel.path, lambda: None)
    guest: list[socket.socket] = []

    def handshake() -> None:
        g = channel.accept()
        guest.append(g)
        for answer in (HELLO, OPENED):
            head = g.recv(HEADER.size, socket.MSG_WAITALL)
            kind, conn, length = HEADER.unpack(head)
            payload = g.recv(length, socket.MSG_WAITALL) if length else b""
            assert kind == (HELLO if answer == HELLO else OPEN)
            g.sendall(frame(answer, conn, payload if answer == HELLO else b""))

    threading.Thread(target=handshake, daemon=True).start()
    mux.connect()
    stream = new_stream(mux, 80)
    try:
        yield mux, stream
    finally:
        mux.close("test over")
        for g in guest:
            g.close()
        channel.close()


def test_a_send_into_a_guest_that_never_reads_ends_by_its_deadline(
    short_deadlines: None, deaf_guest: tuple[Mux, Stream]
) -> None:
    mux, stream = deaf_guest
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            mux.send(stream, b"x" * (64 * 2**20))  # far more than the channel and the stream's queue take
            outcome.append(None)
        except OsfleetError as exc:
            outcome.append(exc)

    started = time.monotonic()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(DEADLINE * 10)
    assert not sender.is_alive(), "a send into a guest that never reads held its thread past its deadline"
    assert time.monotonic() - started < DEADLINE * 10
    (exc,) = outcome
    assert isinstance(exc, TunnelStalledError) and "did not take" in str(exc)
    assert stream.closed and "did not take" in stream.closed
    deadline = time.monotonic() + DEADLINE * 10
    while mux.dead is None and time.monotonic() < deadline:  # the channel's writer gives it up too
        time.sleep(0.02)
    assert mux.dead and "did not read its tunnel channel" in mux.dead


def test_an_api_send_waits_for_room_on_the_event_loop_not_in_a_thread(
    short_deadlines: None, deaf_guest: tuple[Mux, Stream]
) -> None:
    mux, stream = deaf_guest
    table = Tunnels(None, lambda domain: None)  # type: ignore[arg-type]  # the stream is given: no channel looked up

    async def main() -> tuple[float, int]:
        ticks = 0

        async def tick() -> None:  # the event loop stays free while the send waits
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        with pytest.raises(TunnelStalledError):
            await table.send(stream, b"y" * (64 * 2**20))
        ticker.cancel()
        return time.monotonic() - started, ticks

    took, ticks = asyncio.run(asyncio.wait_for(main(), DEADLINE * 10))
    assert took < DEADLINE * 5 and ticks > DEADLINE * 20


def test_a_guest_service_that_never_reads_holds_no_other_connection_up(tmp_path: Path) -> None:
    channel = Channel(tmp_path)
    deaf = socket.create_server(("127.0.0.1", 0))  # accepts, never reads
    deaf_port = deaf.getsockname()[1]
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(deaf.accept()[0]), daemon=True).start()
    srv, echo_port = echo_server()
    mux = connected(channel)
    try:
        stuck = new_stream(mux, deaf_port)
        flood = threading.Thread(target=_send_quietly, args=(mux, stuck, b"z" * (64 * 2**20)), daemon=True)
        flood.start()  # far more than the deaf service, the kernel's buffers and the relay's buffer for it take
        deadline = time.monotonic() + 20
        while stuck.closed is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stuck.closed and "did not read" in stuck.closed  # the relay dropped that connection, said why
        alive = new_stream(mux, echo_port)
        mux.send(alive, b"still here")
        assert drain(alive, 10) == b"still here"  # and kept serving the others
        flood.join(20)
        assert not flood.is_alive()
    finally:
        mux.close("test over")
        srv.close()
        deaf.close()
        for c in held:
            c.close()
        channel.close()


def _send_quietly(mux: Mux, stream: Stream, data: bytes) -> None:
    with contextlib.suppress(OsfleetError):  # the stream ends under it: that is the point
        mux.send(stream, data)


class OneChannel:
    """``Tunnels``' view of the replicas' channels: one socket path, for the domain ``d``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def channel_path(self, domain: str, target: str) -> Path | None:
        return self.path


def test_a_tunnel_opening_into_a_guest_that_never_answers_holds_no_lock_or_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tunnels, "OPEN_SECONDS", 2 * DEADLINE)
    channel = Channel(tmp_path)
    guest: list[socket.socket] = []

    def hello_only() -> None:  # the relay answers its hello, then never an OPEN
        g = channel.accept()
        guest.append(g)
        kind, conn, length = HEADER.unpack(g.recv(HEADER.size, socket.MSG_WAITALL))
        g.sendall(frame(HELLO, conn, g.recv(length, socket.MSG_WAITALL)))

    threading.Thread(target=hello_only, daemon=True).start()
    table = Tunnels(OneChannel(channel.path), lambda domain: None)  # type: ignore[arg-type]
    try:
        started = time.monotonic()
        stream = table.open("r-1", 1, "l-1", "d", 80)  # what runs under the replica's lock
        assert time.monotonic() - started < DEADLINE  # asked, not waited for
        assert not stream.opened

        async def answer() -> float:
            begun = time.monotonic()
            with pytest.raises(TunnelError, match="did not connect"):
                await table.opened(stream)
            return time.monotonic() - begun

        took = asyncio.run(asyncio.wait_for(answer(), 10 * DEADLINE))
        assert 2 * DEADLINE <= took < 6 * DEADLINE and stream.closed
    finally:
        table.shutdown()
        for g in guest:
            g.close()
        channel.close()
