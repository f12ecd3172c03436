"""Fake guests' tunnel channels for tests without a VM: one UNIX socket per domain stands in for the virtio-serial
port, and the guest's real relay (``osfleet.replicas.guest_tunnel.Relay``) serves it in a thread, reaching this
machine's loopback where a guest's would reach its own.

A relay reads a file descriptor number, not a socket object: ``close`` ends every relay before it closes the
sockets they read, or a relay left running would read a later test's socket once that number is reused."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

from osfleet.replicas.guest_tunnel import Relay

RELAY_ALONE_SECONDS = 1.0  # each host connection is a socket of its own here: an empty read there is its end


class FakeGuestChannels:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._listeners: dict[str, socket.socket] = {}
        self._guests: list[socket.socket] = []
        self._relays: list[threading.Thread] = []
        self.starts: list[str] = []

    def channel_path(self, domain: str, target: str) -> Path | None:
        path = self.folder / f"{domain}.sock"
        with self._lock:
            if domain not in self._listeners:
                self.folder.mkdir(parents=True, exist_ok=True)
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(str(path))
                listener.listen(4)
                self._listeners[domain] = listener
        return path

    def start(self, domain: str) -> None:
        """The relay, on the host's pending connection to the domain's channel."""
        guest, _ = self._listeners[domain].accept()
        relay = threading.Thread(target=Relay(guest.fileno()).serve, args=(RELAY_ALONE_SECONDS,), daemon=True)
        with self._lock:
            self._guests.append(guest)
            self._relays.append(relay)
            self.starts.append(domain)
        relay.start()

    def close(self) -> None:
        with self._lock:
            listeners, guests, relays = list(self._listeners.values()), self._guests, self._relays
            self._listeners, self._guests, self._relays = {}, [], []
        for listener in listeners:
            listener.close()
        for guest in guests:
            with contextlib.suppress(OSError):
                guest.shutdown(socket.SHUT_RDWR)  # the relay reads its end, then ends alone
        for relay in relays:
            relay.join(RELAY_ALONE_SECONDS + 5)
        for guest in guests:
            guest.close()
