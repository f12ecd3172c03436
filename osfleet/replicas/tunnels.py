"""The host's end of osfleet's tunnels: byte streams to TCP ports on a replica's own loopback.

A replica has no network, yet programs on the client's side expect to reach services inside it: OSWorld's
harness connects Playwright to Chrome's DevTools (an HTTP request, then a WebSocket kept open). Every replica has
a virtio-serial channel ``org.osfleet.tunnel.0`` (``domain_xml``); ``Mux`` holds the host's end of it (a UNIX
socket libvirt names in the live XML), starts the guest's relay (``osfleet.replicas.guest_tunnel``) through the
guest agent when no relay answers, and carries many connections over the one stream as frames.

``Tunnels`` is the host agent's table of open streams: each has an unguessable id, the replica and generation it
was opened on (a reset or a release ends the VM it ran on, so it reads as closed), and a bounded buffer of what
the guest sent (``MAX_BUFFERED``: a client that stops reading loses its stream, never the host's memory). The
API's calls (``osfleet.api.routes.tunnels``) check the caller's lease first; only then is a stream looked up.

Everything from the guest is hostile: frames are bounded, ids must be ones the host opened, and the relay's
answers are awaited with deadlines. A guest that stops reading its channel must not hold anything of the host
either, so nothing is written to the channel by the thread that has something to send: frames wait in the
``Outbox`` (control frames first, then one frame of each stream in turn, each stream's bytes bounded by
``MAX_QUEUED``) and the ``Mux``'s own writer thread writes them, each within ``WRITE_SECONDS`` (a channel that
takes nothing for that long is given up: its streams end, the replica's next tunnel starts a new one). A client's
bytes wait for room in their stream's queue at most ``SEND_SECONDS`` (then the stream ends and the sender is told
why, 409): asynchronously for the API (``Tunnels.send``: no worker thread waits), and never under the replica's
lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import select
import shlex
import socket
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Protocol, cast

from osfleet.errors import OsfleetError
from osfleet.replicas import guest_tunnel
from osfleet.replicas.guest_tunnel import CLOSE, DATA, HEADER, HELLO, MAX_PAYLOAD, OPEN, OPENED, frame
from osfleet.vm.virt import Virt

log = logging.getLogger(__name__)

CHANNEL = guest_tunnel.PORT_NAME
HELLO_SECONDS = 1.5  # an answer from a relay already running (milliseconds, even under TCG)
START_SECONDS = 60.0  # python3 starting in a TCG guest
OPEN_SECONDS = 15.0
MAX_BUFFERED = 8 * 2**20  # what the guest sent and the client has not read yet, per stream
MAX_QUEUED = 1 * 2**20  # what the client sent and the guest's channel has not taken yet, per stream
WRITE_SECONDS = 10.0  # a frame the guest's channel does not take within this: the channel is given up
SEND_SECONDS = 15.0  # a client's bytes that find no room in their stream's queue within this: the stream ends
MAX_STREAMS_PER_REPLICA = 16
MAX_WAIT_SECONDS = 25.0
Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Event]  # an event loop's wait on a stream (``Stream.parked``)


class TunnelError(OsfleetError):
    """The tunnel could not be made (no channel, the relay did not start or answer)."""


class TunnelNotFoundError(OsfleetError):
    """No open stream of that id for this lease (never opened, another's, or closed and read to its end)."""


class TunnelRefusedError(OsfleetError):
    """Nothing accepted the connection inside the replica (no program listens on that port), or too many
    streams are open already."""


class TunnelStalledError(OsfleetError):
    """The replica did not take what was sent into a tunnel within ``SEND_SECONDS``: the stream ended."""


@dataclass
class Stream:
    """One connection to a port inside a replica; what the guest sent waits in ``buffer``."""

    id: str
    conn: int
    port: int
    replica_id: str
    generation: int
    lease_id: str | None
    mux: Mux
    buffer: bytearray = field(default_factory=bytearray)
    opened: bool = False
    closed: str | None = None  # why, once the connection is over
    cond: threading.Condition = field(default_factory=threading.Condition)
    waiters: list[Waiter] = field(default_factory=list)  # event loops waiting in ``take_async``
    senders: list[Waiter] = field(default_factory=list)  # and in ``Tunnels.send``, for room

    def feed(self, data: bytes) -> None:
        with self.cond:
            if self.closed is not None:
                return
            if len(self.buffer) + len(data) > MAX_BUFFERED:
                self.closed = f"more than {MAX_BUFFERED} bytes waited unread"
                self.buffer.clear()
                self.mux.send_close(self.conn)
            else:
                self.buffer += data
            self._wake()

    def end(self, reason: str) -> None:
        with self.cond:
            if self.closed is None:
                self.closed = reason or "closed"
            self._wake()

    def _wake(self) -> None:
        """Under ``cond``: threads waiting in ``take`` or ``Mux.send``, event loops in ``take_async`` or
        ``Tunnels.send`` (an ended stream wakes its senders too)."""
        self.cond.notify_all()
        for loop, event in self.waiters + self.senders:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(event.set)
        self.waiters.clear()
        self.senders.clear()

    def room(self) -> None:
        """The channel took one of this stream's frames: its senders may queue more."""
        with self.cond:
            self._wake()

    async def parked(self, waiters: list[Waiter], waiter: Waiter, left: float) -> bool:
        """Wait on an event loop until ``waiter`` is woken (``_wake``) or ``left`` seconds pass, holding no thread;
        True when woken. The caller put it in ``waiters`` under ``cond``, after looking at what it waits for (so
        no wake-up falls between the two); it is taken out here."""
        try:
            if left > 0:
                await asyncio.wait_for(waiter[1].wait(), left)
        except TimeoutError:
            pass
        finally:
            with self.cond, contextlib.suppress(ValueError):
                waiters.remove(waiter)
        return waiter[1].is_set()

    async def take_async(self, max_bytes: int, wait: float) -> bytes | None:
        """``take`` for an event loop: the wait holds no thread (a host agent's worker threads are few, and a
        client may keep a receive waiting on each of its tunnels)."""
        deadline = time.monotonic() + wait
        while True:
            waiter = (asyncio.get_running_loop(), asyncio.Event())
            with self.cond:
                if self.buffer or self.closed is not None:
                    return self.take(max_bytes, 0)
                self.waiters.append(waiter)
            if not await self.parked(self.waiters, waiter, deadline - time.monotonic()):
                with self.cond:
                    return self.take(max_bytes, 0) if self.buffer or self.closed is not None else b""

    def take(self, max_bytes: int, wait: float) -> bytes | None:
        """Up to ``max_bytes`` the guest sent, waiting up to ``wait`` seconds for some; b"" when none came in
        time, None when the connection is over and everything was read."""
        deadline = time.monotonic() + wait
        with self.cond:
            while not self.buffer and self.closed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return b""
                self.cond.wait(left)
            if not self.buffer:
                return None
            out = bytes(self.buffer[:max_bytes])
            del self.buffer[:max_bytes]
            return out


class Outbox:
    """Frames waiting for a channel: control frames (HELLO, OPEN, CLOSE) first, then one frame of each stream in
    turn, so a stream with much to send never holds another's up. Each stream holds at most ``limit`` bytes here;
    ``put`` takes what fits and says how much. Thread-safe."""

    def __init__(self, limit: int = MAX_QUEUED) -> None:
        self.limit = limit
        self._cond = threading.Condition()
        self._control: deque[bytes] = deque()
        self._streams: OrderedDict[int, deque[bytes]] = OrderedDict()
        self._queued: dict[int, int] = {}
        self._closed = False

    def control(self, data: bytes) -> None:
        with self._cond:
            self._control.append(data)
            self._cond.notify()

    def put(self, conn: int, data: bytes) -> int:
        """Queue as much of ``data`` as the stream's room takes (whole frames of at most ``MAX_PAYLOAD``)."""
        taken = 0
        with self._cond:
            if self._closed:
                return 0
            frames = self._streams.setdefault(conn, deque())
            while taken < len(data):
                chunk = data[taken : taken + MAX_PAYLOAD]
                if self._queued.get(conn, 0) + len(chunk) > self.limit:
                    break
                frames.append(frame(DATA, conn, chunk))
                self._queued[conn] = self._queued.get(conn, 0) + len(chunk)
                taken += len(chunk)
            if taken:
                self._cond.notify()
        return taken

    def queued(self, conn: int) -> int:
        with self._cond:
            return self._queued.get(conn, 0)

    def drop(self, conn: int) -> None:
        """Forget what a stream still had to send (it ended)."""
        with self._cond:
            self._streams.pop(conn, None)
            self._queued.pop(conn, None)

    def take(self) -> tuple[int | None, bytes] | None:
        """The next frame and its stream (None for a control frame), waiting for one; None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._control:
                    return None, self._control.popleft()
                for conn, frames in self._streams.items():
                    if frames:
                        data = frames.popleft()
                        self._queued[conn] -= len(data) - HEADER.size
                        self._streams.move_to_end(conn)  # the others go first next time
                        return conn, data
                self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._control.clear()
            self._streams.clear()
            self._queued.clear()
            self._cond.notify_all()


class Mux:
    """The host's end of one running VM's tunnel channel (the module's docstring)."""

    def __init__(self, path: Path, start_relay: Callable[[], None]) -> None:
        self.path = path
        self._start_relay = start_relay
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._streams: dict[int, Stream] = {}
        self._next = 1
        self._hello: tuple[bytes, threading.Event] | None = None
        self._outbox = Outbox()
        self.dead: str | None = None

    # --- the channel ----------------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Connect to the channel and make sure a relay answers in the guest (started if none does)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.path))
        except OSError as exc:
            sock.close()
            raise TunnelError(f"tunnel channel {self.path}: {exc.strerror or exc}") from None
        self._sock = sock
        threading.Thread(target=self._read, name=f"tunnel-{self.path.parent.name}", daemon=True).start()
        threading.Thread(target=self._write_frames, name=f"tunnel-w-{self.path.parent.name}", daemon=True).start()
        if self._say_hello(HELLO_SECONDS):
            return
        self._start_relay()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and self.dead is None:
            if self._say_hello(min(2.0, max(0.1, deadline - time.monotonic()))):
                return
        self.close("the guest's tunnel relay did not answer")
        raise TunnelError(f"the guest's tunnel relay did not answer within {START_SECONDS:.0f} s")

    def _say_hello(self, timeout: float) -> bool:
        nonce, answered = secrets.token_bytes(16), threading.Event()
        self._hello = (nonce, answered)
        try:
            self._send(frame(HELLO, 0, nonce))
        except OSError:
            return False
        return answered.wait(timeout)

    def _send(self, data: bytes) -> None:
        """A control frame, queued for the writer (``OSError`` once the channel is closed)."""
        if self._sock is None or self.dead is not None:
            raise OSError("the tunnel channel is closed")
        self._outbox.control(data)

    def _write_frames(self) -> None:
        """The writer thread: each queued frame into the channel within ``WRITE_SECONDS``, else the channel is
        given up (a guest that stops reading it holds nothing of the host)."""
        while True:
            item = self._outbox.take()
            sock = self._sock
            if item is None or sock is None:
                return
            conn, data = item
            try:
                _write_within(sock, data, WRITE_SECONDS)
            except TimeoutError:
                self.close(f"the guest did not read its tunnel channel for {WRITE_SECONDS:.0f} s")
                return
            except OSError as exc:
                self.close(f"the tunnel channel failed: {exc}")
                return
            if conn is not None:
                with self._lock:
                    stream = self._streams.get(conn)
                if stream is not None:
                    stream.room()

    def _read(self) -> None:
        sock, buf = self._sock, b""
        assert sock is not None
        reason = "the replica's VM went away"
        try:
            while True:
                chunk = sock.recv(MAX_PAYLOAD + HEADER.size)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= HEADER.size:
                    kind, conn, length = HEADER.unpack_from(buf)
                    if length > MAX_PAYLOAD:
                        raise ValueError(f"the guest sent a frame of {length} bytes")
                    if len(buf) < HEADER.size + length:
                        break
                    payload, buf = buf[HEADER.size : HEADER.size + length], buf[HEADER.size + length :]
                    self._from_guest(kind, conn, payload)
        except (OSError, ValueError) as exc:
            reason = f"the tunnel channel failed: {exc}"
        self.close(reason)

    def _from_guest(self, kind: int, conn: int, payload: bytes) -> None:
        if kind == HELLO:
            hello = self._hello
            if hello is not None and payload == hello[0]:
                hello[1].set()
            return
        with self._lock:
            stream = self._streams.get(conn)
        if stream is None:
            return  # a connection the host closed already (or an id it never gave: ignored)
        if kind == OPENED:
            with stream.cond:
                stream.opened = True
                stream._wake()
        elif kind == DATA:
            stream.feed(payload)
        elif kind == CLOSE:
            self._forget(conn)
            stream.end(payload.decode("utf-8", "replace")[:200] or "closed")
        else:
            raise ValueError(f"the guest sent an unknown frame kind {kind}")

    def close(self, reason: str) -> None:
        """End the channel and every stream on it."""
        if self.dead is None:
            self.dead = reason
        self._outbox.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.end(self.dead)  # the first reason, whichever thread saw the end first

    # --- streams --------------------------------------------------------------------------------------------------
    def begin(self, port: int, make: Callable[[int], Stream]) -> Stream:
        """Ask the guest for a new connection to ``127.0.0.1:port``, without waiting for its answer (``settle``
        says what came of it): the caller holds the replica's lock, which must not wait for a guest."""
        with self._lock:
            if len(self._streams) >= MAX_STREAMS_PER_REPLICA:
                raise TunnelRefusedError(f"{MAX_STREAMS_PER_REPLICA} tunnels are open on this replica already")
            conn, self._next = self._next, self._next + 1
            stream = make(conn)
            self._streams[conn] = stream
        try:
            self._send(frame(OPEN, conn, struct.pack(">H", port)))
        except OSError as exc:
            self._forget(conn)
            raise TunnelError(f"tunnel channel: {exc}") from None
        return stream

    def settle(self, stream: Stream) -> Stream:
        """The stream once the guest connected it; ``TunnelRefusedError`` when nothing accepted the connection
        there, ``TunnelError`` when the guest's relay gave no answer by the deadline (the connection is dropped)."""
        if stream.opened:
            return stream
        self._forget(stream.conn)
        if stream.closed is None:
            self.send_close(stream.conn)
            stream.end("no answer from the guest's relay")
            raise TunnelError(f"the guest's relay did not connect to port {stream.port} within {OPEN_SECONDS:.0f} s")
        raise TunnelRefusedError(f"nothing accepted a connection to port {stream.port} in the replica: {stream.closed}")

    def open(self, port: int, make: Callable[[int], Stream]) -> Stream:
        """A new connection to ``127.0.0.1:port`` in the guest, waiting in this thread for the guest's answer."""
        stream = self.begin(port, make)
        deadline = time.monotonic() + OPEN_SECONDS
        with stream.cond:
            while not stream.opened and stream.closed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                stream.cond.wait(left)
        return self.settle(stream)

    def queue(self, stream: Stream, data: bytes) -> int:
        """Queue what fits of ``data`` for the stream (the caller holds ``stream.cond``); ``TunnelNotFoundError``
        when the stream or its channel is over."""
        if self.dead is not None and stream.closed is None:
            stream.closed = self.dead
        if stream.closed is not None:
            raise TunnelNotFoundError(f"tunnel {stream.id} is closed ({stream.closed})")
        return self._outbox.put(stream.conn, data)

    def stalled(self, stream: Stream) -> TunnelStalledError:
        """End a stream whose bytes found no room within ``SEND_SECONDS``; the error says why."""
        why = f"the replica did not take what was sent into tunnel {stream.id} within {SEND_SECONDS:.0f} s"
        stream.end(why)
        self.send_close(stream.conn)
        return TunnelStalledError(f"{why}: the tunnel is closed")

    def send(self, stream: Stream, data: bytes, seconds: float | None = None) -> None:
        """Queue ``data`` for the stream, waiting (this thread) up to ``seconds`` (default ``SEND_SECONDS``) for room
        as the channel takes it."""
        deadline = time.monotonic() + (SEND_SECONDS if seconds is None else seconds)
        with stream.cond:
            while data:
                data = data[self.queue(stream, data) :]
                left = deadline - time.monotonic()
                if data and left <= 0:
                    raise self.stalled(stream)
                if data:
                    stream.cond.wait(left)

    def send_close(self, conn: int) -> None:
        self._forget(conn)
        self._outbox.drop(conn)
        with contextlib.suppress(OSError):
            self._send(frame(CLOSE, conn))

    def _forget(self, conn: int) -> None:
        with self._lock:
            self._streams.pop(conn, None)


def _write_within(sock: socket.socket, data: bytes, seconds: float) -> None:
    """All of ``data`` into a blocking socket within ``seconds`` (``TimeoutError`` past them), without ever
    blocking in ``send`` itself: each write takes what the socket's buffer has room for."""
    deadline = time.monotonic() + seconds
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(view)} bytes not taken within {seconds:.0f} s")
        _, writable, _ = select.select([], [sock], [], left)
        if not writable:
            continue
        try:
            view = view[sock.send(view, socket.MSG_DONTWAIT) :]
        except BlockingIOError:
            continue


def relay_source() -> str:
    return resources.files("osfleet.replicas").joinpath("guest_tunnel.py").read_text()


def start_relay(virt: Virt, domain: str) -> None:
    """Launch the guest's relay as root (it opens the port, then drops to the desktop user), detached."""
    program = shlex.quote(relay_source())
    code, _, err = virt.guest_exec(
        domain, ["/bin/sh", "-c", f"python3 -c {program} </dev/null >/run/osfleet-tunnel.log 2>&1 &"], timeout=60
    )
    if code != 0:
        raise TunnelError(f"{domain}: starting the tunnel relay failed: {err.strip()[:200]}")


class Channels(Protocol):
    """Where a running VM's tunnel channel is (``Virt``; a test's fake guests)."""

    def channel_path(self, domain: str, target: str) -> Path | None: ...


class Tunnels:
    """The host agent's open streams, by id, and one ``Mux`` per running VM."""

    def __init__(self, virt: Channels, start: Callable[[str], None] | None = None) -> None:
        """``start(domain)`` launches the guest's relay (default: through the guest agent, ``start_relay``)."""
        self.virt = virt
        self._start = start or (lambda domain: start_relay(cast(Virt, virt), domain))
        self._lock = threading.Lock()
        self._muxes: dict[str, Mux] = {}  # by domain
        self._streams: dict[str, Stream] = {}

    def _mux(self, domain: str) -> Mux:
        """The domain's live channel (a new one when the VM behind the old one went away: a reset)."""
        path = self.virt.channel_path(domain, CHANNEL)
        if path is None:
            raise TunnelError(f"{domain} has no {CHANNEL} channel (a replica made by an older osfleet)")
        with self._lock:
            mux = self._muxes.get(domain)
            if mux is not None and mux.dead is None and mux.path == path:
                return mux
        if mux is not None:
            mux.close("the replica's VM was replaced")
        mux = Mux(path, lambda: self._start(domain))
        mux.connect()
        with self._lock:
            self._muxes[domain] = mux
        return mux

    def open(self, replica_id: str, generation: int, lease_id: str | None, domain: str, port: int) -> Stream:
        """Ask for a stream to ``port`` inside the replica (called under the replica's lock, its lease checked);
        ``opened`` waits for the guest's answer, after the lock is let go."""
        mux = self._mux(domain)
        self._prune()

        def make(conn: int) -> Stream:
            return Stream(f"t-{secrets.token_urlsafe(12)}", conn, port, replica_id, generation, lease_id, mux)

        return mux.begin(port, make)

    async def opened(self, stream: Stream) -> Stream:
        """The stream ``open`` asked for, once the guest connected it (``Mux.settle``'s errors otherwise), waiting
        on the event loop: no thread and no replica's lock is held while a guest takes its time."""
        deadline = time.monotonic() + OPEN_SECONDS
        while True:
            waiter = (asyncio.get_running_loop(), asyncio.Event())
            with stream.cond:
                if stream.opened or stream.closed is not None:
                    break
                stream.waiters.append(waiter)
            woken = await stream.parked(stream.waiters, waiter, deadline - time.monotonic())
            if not woken and deadline - time.monotonic() <= 0:
                break
        stream.mux.settle(stream)
        with self._lock:
            self._streams[stream.id] = stream
        log.info("tunnel %s to port %d of %s", stream.id, stream.port, stream.replica_id)
        return stream

    def get(self, tunnel_id: str, replica_id: str, generation: int, lease_id: str | None) -> Stream:
        """The stream ``tunnel_id`` of that replica's current generation, opened under ``lease_id`` (None: the
        operator's, any), or ``TunnelNotFoundError``."""
        with self._lock:
            stream = self._streams.get(tunnel_id)
        if stream is None or stream.replica_id != replica_id or lease_id not in (None, stream.lease_id):
            raise TunnelNotFoundError(f"no tunnel {tunnel_id} on replica {replica_id}")
        if stream.generation != generation:
            stream.end("the replica was reset")
            self.forget(tunnel_id)
            raise TunnelNotFoundError(f"tunnel {tunnel_id} ended when replica {replica_id} was reset or released")
        return stream

    async def send(self, stream: Stream, data: bytes, seconds: float | None = None) -> None:
        """Into the stream's queue, waiting (on the event loop: no thread held) up to ``seconds`` (default
        ``SEND_SECONDS``) for room; ``TunnelNotFoundError`` when the stream is over, ``TunnelStalledError`` when the
        replica took too little."""
        deadline = time.monotonic() + (SEND_SECONDS if seconds is None else seconds)
        mux = stream.mux
        while True:
            waiter = (asyncio.get_running_loop(), asyncio.Event())
            with stream.cond:
                data = data[mux.queue(stream, data) :]
                if not data:
                    return
                stream.senders.append(waiter)
            woken = await stream.parked(stream.senders, waiter, deadline - time.monotonic())
            if not woken and deadline - time.monotonic() <= 0:
                with stream.cond:
                    data = data[mux.queue(stream, data) :]
                    if not data:
                        return
                raise mux.stalled(stream)

    async def receive(self, stream: Stream, max_bytes: int, wait: float) -> bytes:
        """What the guest sent (b"" when nothing came within ``wait``); ``TunnelNotFoundError`` once the
        connection is over and read to its end."""
        data = await stream.take_async(max_bytes, min(wait, MAX_WAIT_SECONDS))
        if data is None:
            self.forget(stream.id)
            raise TunnelNotFoundError(f"tunnel {stream.id} is closed: {stream.closed}")
        return data

    def close(self, stream: Stream) -> None:
        stream.end("closed by the client")
        stream.mux.send_close(stream.conn)
        self.forget(stream.id)

    def forget(self, tunnel_id: str) -> None:
        with self._lock:
            self._streams.pop(tunnel_id, None)

    def _prune(self) -> None:
        """Streams of VMs that went away, never read to their end by their client."""
        with self._lock:
            gone = [tid for tid, s in self._streams.items() if s.mux.dead is not None and not s.buffer]
            for tid in gone:
                del self._streams[tid]
            for domain in [d for d, m in self._muxes.items() if m.dead is not None]:
                del self._muxes[domain]

    def shutdown(self) -> None:
        with self._lock:
            muxes, self._muxes, self._streams = list(self._muxes.values()), {}, {}
        for mux in muxes:
            mux.close("the host agent stopped")
