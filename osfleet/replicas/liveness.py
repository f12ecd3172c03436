"""Liveness of running replicas beyond "QEMU is there": a frozen QEMU or a hung guest agent still looks
running to libvirt, so each running replica's guest agent is pinged now and then, off the monitor's
thread, and a replica that misses several pings in a row is reported dead.

The thresholds are generous on purpose: under TCG a busy guest can be slow to answer, and declaring a
healthy replica dead would abort its episode for nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from osfleet.errors import OsfleetError
from osfleet.vm.virt import Virt

log = logging.getLogger(__name__)

PROBE_EVERY_SECONDS = 10.0
PROBE_TIMEOUT_SECONDS = 5
MISSES_TO_DIE = 3
PROBE_WORKERS = 2
STOPPED_SECONDS = 15.0  # a QEMU process stopped (SIGSTOP, state T) this long is frozen, whatever libvirt says


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
        self._stopped_since: dict[str, float] = {}  # domain -> when its QEMU was first seen stopped

    def probe(self, domains: list[str]) -> None:
        """Send a ping to every domain whose last one is older than ``every`` (and not still waiting)."""
        now = time.monotonic()
        with self._lock:
            for gone in set(self._last) - set(domains):  # forget domains that are no longer running
                self._last.pop(gone, None)
                self._missed.pop(gone, None)
                self._stopped_since.pop(gone, None)
            due = [d for d in domains if d not in self._inflight and now - self._last.get(d, 0.0) >= self.every]
            for d in due:
                self._inflight.add(d)
                self._last[d] = now
        for d in due:
            self._check_stopped(d, now)
            try:
                self._pool.submit(self._ping, d)
            except RuntimeError:  # shut down
                return

    def _check_stopped(self, domain: str, now: float) -> None:
        """A stopped QEMU answers nothing, but libvirt's calls to it wait on their locks for a long time
        first; the process state says it at once (read from /proc, no call into libvirt)."""
        pid = self.virt.qemu_pid(domain)
        try:
            stopped = pid is not None and psutil.Process(pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            stopped = False
        with self._lock:
            if stopped:
                self._stopped_since.setdefault(domain, now)
            else:
                self._stopped_since.pop(domain, None)

    def _ping(self, domain: str) -> None:
        """One probe; whatever it raises counts as a miss and the domain stays watched (an error that is not
        osfleet's own, say from a libvirt binding, once left it "in flight" forever: never probed again)."""
        ok = False
        try:
            self.virt.agent(domain, "guest-ping", timeout=PROBE_TIMEOUT_SECONDS)
            ok = True
        except OsfleetError:
            pass
        except Exception:
            log.exception("probing the guest agent of %s", domain)
        finally:
            with self._lock:
                self._inflight.discard(domain)
                self._missed[domain] = 0 if ok else self._missed.get(domain, 0) + 1

    def dead(self) -> set[str]:
        now = time.monotonic()
        with self._lock:
            silent = {d for d, n in self._missed.items() if n >= self.misses}
            frozen = {d for d, t in self._stopped_since.items() if now - t >= STOPPED_SECONDS}
            return silent | frozen

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
