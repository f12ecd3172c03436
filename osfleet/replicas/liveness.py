"""Liveness of running replicas beyond "QEMU is there": a frozen QEMU or a hung guest agent still looks
running to libvirt, so each running replica's guest agent is pinged now and then, off the monitor's
thread, and a replica that misses several pings in a row is reported dead.

The thresholds are generous on purpose: under TCG a busy guest can be slow to answer, and declaring a
healthy replica dead would abort its episode for nothing.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from osfleet.errors import OsfleetError
from osfleet.virt import Virt

PROBE_EVERY_SECONDS = 10.0
PROBE_TIMEOUT_SECONDS = 5
MISSES_TO_DIE = 3
PROBE_WORKERS = 2


class Liveness:
    """Pings guest agents in the background; ``dead()`` names domains that stopped answering."""

    def __init__(self, virt: Virt, every: float = PROBE_EVERY_SECONDS, misses: int = MISSES_TO_DIE) -> None:
        self.virt = virt
        self.every = every
        self.misses = misses
        self._pool = ThreadPoolExecutor(max_workers=PROBE_WORKERS, thread_name_prefix="osfleet-liveness")
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # domain -> when its last probe was sent
        self._missed: dict[str, int] = {}  # domain -> pings missed in a row
        self._inflight: set[str] = set()

    def probe(self, domains: list[str]) -> None:
        """Send a ping to every domain whose last one is older than ``every`` (and not still waiting)."""
        now = time.monotonic()
        with self._lock:
            for gone in set(self._last) - set(domains):  # forget domains that are no longer running
                self._last.pop(gone, None)
                self._missed.pop(gone, None)
            due = [d for d in domains if d not in self._inflight and now - self._last.get(d, 0.0) >= self.every]
            for d in due:
                self._inflight.add(d)
                self._last[d] = now
        for d in due:
            try:
                self._pool.submit(self._ping, d)
            except RuntimeError:  # shut down
                return

    def _ping(self, domain: str) -> None:
        try:
            self.virt.agent(domain, "guest-ping", timeout=PROBE_TIMEOUT_SECONDS)
            ok = True
        except OsfleetError:
            ok = False
        with self._lock:
            self._inflight.discard(domain)
            self._missed[domain] = 0 if ok else self._missed.get(domain, 0) + 1

    def dead(self) -> set[str]:
        with self._lock:
            return {d for d, n in self._missed.items() if n >= self.misses}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
