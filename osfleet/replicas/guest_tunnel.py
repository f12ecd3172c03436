"""The guest's end of osfleet's tunnels: TCP connections to the guest's own ports, carried over a virtio-serial port.

This file is a guest program (python3's standard library only) and is imported on the host only by
``osfleet.replicas.tunnels`` (for the frame layout, which it shares) and by tests. The host starts it through the
guest agent when a replica's first tunnel opens (``tunnels.Mux``); it opens the port ``org.osfleet.tunnel.0`` (a
virtio-serial channel osfleet gives every replica) as root, then drops to the desktop user, so what it connects
to is what the desktop user could connect to. A replica with no network still has services of its own on its
loopback (Chrome's DevTools, VLC's HTTP interface) that programs on the host side expect to reach, as OSWorld's
harness does; the tunnel is the host reaching in, never the guest reaching out: the guest can only answer the
connections the host opens.

The stream carries frames, both ways: a header ``>BII`` (kind, connection id, payload length) and the payload,
at most ``MAX_PAYLOAD`` bytes:

    HELLO  id=0, payload: a nonce      host -> guest: forget every connection; guest -> host: the same nonce
    OPEN   id, payload: port (>H)      host -> guest: connect to 127.0.0.1:port
    OPENED id                          guest -> host: connected
    DATA   id, payload: bytes          both ways
    CLOSE  id, payload: a reason       both ways: the connection is over (no half-close)

Anything malformed from the host ends the program (the host starts a new one); the host treats what this program
sends as hostile input too (bounded frames, known ids only). A service that stops reading its connection holds
nothing else up: what the host sends it waits in that connection's own buffer (``MAX_PENDING``; past it the
connection is closed, and the host told why), and every socket is written only when it has room.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import select
import signal
import socket
import struct
import sys
import time

PORT_NAME = "org.osfleet.tunnel.0"  # domain_xml.TUNNEL_CHANNEL (this file imports nothing of osfleet)
HEADER = struct.Struct(">BII")
HELLO, OPEN, OPENED, DATA, CLOSE = 1, 2, 3, 4, 5
MAX_PAYLOAD = 64 * 1024
MAX_CONNECTIONS = 64
MAX_PENDING = 1 * 2**20  # what the host sent a connection and its service has not read yet
CONNECT_SECONDS = 5.0
READ_CHUNK = 32 * 1024
PID_FILE = "/run/osfleet-tunnel.pid"
DESKTOP_USER = "user"
ALONE_SECONDS = 120.0


def frame(kind: int, conn: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, conn, len(payload)) + payload


def find_port(sysfs: str = "/sys/class/virtio-ports") -> str | None:
    """The device of the port the host named ``PORT_NAME`` (no udev symlinks in osfleet's guests)."""
    try:
        entries = sorted(os.listdir(sysfs))
    except OSError:
        return None
    for entry in entries:
        try:
            with open(f"{sysfs}/{entry}/name") as f:
                if f.read().strip() == PORT_NAME:
                    return f"/dev/{entry}"
        except OSError:
            continue
    return None


class Relay:
    """The frames on ``fd`` to and from TCP connections on the guest's loopback."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.conns: dict[int, socket.socket] = {}
        self.ids: dict[int, int] = {}  # socket fd -> connection id
        self.pending: dict[int, bytearray] = {}  # connection id -> bytes its service has not taken yet
        self.buf = b""

    def send(self, kind: int, conn: int, payload: bytes = b"") -> None:
        data = frame(kind, conn, payload)
        while data:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                select.select([], [self.fd], [], 1.0)
                continue
            data = data[n:]

    def drop(self, conn: int, reason: str = "", tell: bool = True) -> None:
        sock = self.conns.pop(conn, None)
        self.pending.pop(conn, None)
        if sock is not None:
            self.ids.pop(sock.fileno(), None)
            sock.close()
            if tell:
                self.send(CLOSE, conn, reason.encode()[:200])

    def reset(self) -> None:
        for conn in list(self.conns):
            self.drop(conn, tell=False)

    def from_host(self, kind: int, conn: int, payload: bytes) -> None:
        if kind == HELLO:
            self.reset()
            self.send(HELLO, 0, payload)
        elif kind == OPEN:
            if conn in self.conns or len(payload) != 2:
                raise ValueError("a bad OPEN")
            if len(self.conns) >= MAX_CONNECTIONS:
                self.send(CLOSE, conn, b"too many connections")
                return
            (port,) = struct.unpack(">H", payload)
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_SECONDS)
            except OSError as exc:
                self.send(CLOSE, conn, f"connect 127.0.0.1:{port}: {exc.strerror or exc}".encode()[:200])
                return
            sock.setblocking(False)
            self.conns[conn] = sock
            self.ids[sock.fileno()] = conn
            self.send(OPENED, conn)
        elif kind == DATA:
            if conn not in self.conns:
                return  # closed here while the host was still sending
            pending = self.pending.setdefault(conn, bytearray())
            if len(pending) + len(payload) > MAX_PENDING:
                self.drop(conn, f"the service did not read {MAX_PENDING} bytes sent to it")
                return
            pending += payload
            self.flush(conn)
        elif kind == CLOSE:
            self.drop(conn, tell=False)
        else:
            raise ValueError(f"unknown frame kind {kind}")

    def flush(self, conn: int) -> None:
        """What the connection's service has room for, without waiting (the socket is non-blocking)."""
        pending, sock = self.pending.get(conn), self.conns.get(conn)
        if not pending or sock is None:
            return
        try:
            sent = sock.send(pending)
        except BlockingIOError:
            return
        except OSError as exc:
            self.drop(conn, f"send: {exc.strerror or exc}")
            return
        del pending[:sent]

    def read_host(self) -> bool:
        """Frames from the host; False when no host is connected (the port reads empty until one is)."""
        try:
            chunk = os.read(self.fd, MAX_PAYLOAD + HEADER.size)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self.reset()
            self.buf = b""
            return False
        self.buf += chunk
        while len(self.buf) >= HEADER.size:
            kind, conn, length = HEADER.unpack_from(self.buf)
            if length > MAX_PAYLOAD:
                raise ValueError(f"a frame of {length} bytes")
            if len(self.buf) < HEADER.size + length:
                break
            payload = self.buf[HEADER.size : HEADER.size + length]
            self.buf = self.buf[HEADER.size + length :]
            self.from_host(kind, conn, payload)
        return True

    def read_conn(self, sock_fd: int) -> None:
        conn = self.ids.get(sock_fd)
        if conn is None:
            return
        try:
            data = self.conns[conn].recv(READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            self.drop(conn, f"recv: {exc.strerror or exc}")
            return
        if data:
            self.send(DATA, conn, data)
        else:
            self.drop(conn, "closed")

    def serve(self, alone_seconds: float = ALONE_SECONDS) -> None:
        """Relay until no host has been connected for ``alone_seconds`` (the guest kernel may see the host's
        connect a while after it happened, so an empty read is not the end at once)."""
        alone_since: float | None = None
        while True:
            waiting = [self.conns[c].fileno() for c, p in self.pending.items() if p and c in self.conns]
            try:
                readable, writable, _ = select.select([self.fd, *self.ids], waiting, [], 1.0)
            except OSError:  # the port itself is gone
                self.reset()
                return
            for fd in writable:
                if fd in self.ids:
                    self.flush(self.ids[fd])
            for fd in readable:
                if fd != self.fd:
                    self.read_conn(fd)
                elif self.read_host():
                    alone_since = None
                else:
                    alone_since = alone_since or time.monotonic()
                    if time.monotonic() - alone_since > alone_seconds:
                        return
                    time.sleep(0.2)


def loopback_up() -> None:
    """The guest's ``lo`` up (a guest without networking may leave it down: its 127.0.0.1 then answers nothing);
    the loopback only, nothing that reaches out of the guest."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s.fileno(), siocgifflags, struct.pack("16sH14s", b"lo", 0, b""))
        flags = struct.unpack_from("16sH", got)[1]
        if not flags & iff_up:
            fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


def _stop_previous() -> None:
    """A relay left by the state this guest was restored from holds the port (it opens once): end it."""
    with contextlib.suppress(OSError, ValueError):
        with open(PID_FILE) as f:
            pid = int(f.read().strip())
        if pid != os.getpid():
            os.kill(pid, signal.SIGKILL)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.02)


def main() -> None:
    port = find_port()
    if port is None:
        sys.exit(f"no virtio-serial port named {PORT_NAME}")
    _stop_previous()
    with contextlib.suppress(OSError):
        loopback_up()
    fd = -1
    for _ in range(100):
        try:
            fd = os.open(port, os.O_RDWR | os.O_NONBLOCK)
            break
        except OSError:  # still held by the relay just ended
            time.sleep(0.05)
    if fd < 0:
        sys.exit(f"cannot open {port}")
    with open(PID_FILE, "w") as f:
        f.write(f"{os.getpid()}\n")
    user = pwd.getpwnam(DESKTOP_USER)
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    Relay(fd).serve()


if __name__ == "__main__":
    main()
