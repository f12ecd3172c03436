"""Fake guests' tunnel channels for tests without a VM: one UNIX socket per domain stands in for the virtio-serial
port, and the guest's real relay (``osfleet.replicas.guest_tunnel.Relay``) serves it in a thread, reaching this
machine's loopback where a guest's would reach its own."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from osfleet.replicas.guest_tunnel import Relay


class FakeGuestChannels:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._listeners: dict[str, socket.socket] = {}
        self._guests: list[socket.socket] = []
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
        with self._lock:
            self._guests.append(guest)
            self.starts.append(domain)
        threading.Thread(target=Relay(guest.fileno()).serve, args=(5.0,), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            for s in [*self._listeners.values(), *self._guests]:
                s.close()
            self._listeners, self._guests = {}, []
