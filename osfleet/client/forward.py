"""``Session.forward(port)``: a port on this machine's loopback that reaches a port on the replica's own loopback.

Programs that expect to reach a service inside the desktop (OSWorld's harness connecting Playwright to Chrome's
DevTools) connect to ``127.0.0.1:<forward.port>`` here; each connection they make becomes a tunnel of the lease
(``AsyncSession.open_tunnel``), and two threads move its bytes: what the program sends goes into the tunnel as it
arrives, what comes out is fetched with waiting receives. A connection the replica refuses (nothing listens there)
is closed at once, as a refused connection would be; when the lease ends, so do its connections.

It listens on 127.0.0.1 only, and whoever can connect to it acts as the desktop user on that port of the replica,
as whoever holds the lease can: so a connection is served only when its other end belongs to this process's own
user (read from the kernel's socket table, ``osfleet.peers``; Playwright's driver is a child process, so the same
user). Another user of the machine is closed at once, before a tunnel is opened for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from typing import Protocol

from osfleet.client.errors import FleetError
from osfleet.peers import loopback_peer_uid

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
CHUNK = 256 * 1024
RECEIVE_WAIT = 20.0
BACKLOG = 16


class Tunnelling(Protocol):
    """The four tunnel calls of a ``Session``."""

    def open_tunnel(self, port: int) -> str: ...

    def tunnel_send(self, tunnel_id: str, data: bytes) -> None: ...

    def tunnel_receive(self, tunnel_id: str, *, wait: float = ...) -> bytes | None: ...

    def close_tunnel(self, tunnel_id: str) -> None: ...


class PortForward:
    """A loopback listener whose connections are tunnels to ``guest_port`` (the module's docstring)."""

    def __init__(self, session: Tunnelling, guest_port: int, port: int = 0) -> None:
        self.session, self.guest_port = session, guest_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, port))
        self._listener.listen(BACKLOG)
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name=f"forward-{self.port}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<PortForward {LOOPBACK}:{self.port} -> replica port {self.guest_port}>"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # the listener was closed: stop()
            if loopback_peer_uid(peer, (LOOPBACK, self.port)) != os.geteuid():
                log.warning("forward to replica port %d: a connection of another user refused", self.guest_port)
                conn.close()
                continue
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name=f"forward-{self.port}-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            try:
                tunnel = self.session.open_tunnel(self.guest_port)
            except FleetError as exc:
                log.info("forward to replica port %d: %s", self.guest_port, exc)
                return  # refused (nothing listens there) or the lease is over: the connection closes
            up = threading.Thread(target=self._upstream, args=(conn, tunnel), daemon=True)
            up.start()
            self._downstream(conn, tunnel)
            up.join(timeout=5)
        finally:
            self._drop(conn)

    def _upstream(self, conn: socket.socket, tunnel: str) -> None:
        """What the local program sends, into the tunnel; its end closes the tunnel."""
        try:
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                self.session.tunnel_send(tunnel, data)
        except (OSError, FleetError) as exc:
            log.debug("forward %s: upstream ended: %s", tunnel, exc)
        with contextlib.suppress(FleetError):
            self.session.close_tunnel(tunnel)

    def _downstream(self, conn: socket.socket, tunnel: str) -> None:
        """What comes out of the tunnel, to the local program, until the tunnel is over."""
        try:
            while not self._stopped.is_set():
                data = self.session.tunnel_receive(tunnel, wait=RECEIVE_WAIT)
                if data is None:
                    break
                if data:
                    conn.sendall(data)
        except (OSError, FleetError) as exc:
            log.debug("forward %s: downstream ended: %s", tunnel, exc)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def _drop(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)
        conn.close()

    def stop(self) -> None:
        """Stop listening and end every connection (idempotent)."""
        self._stopped.set()
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
