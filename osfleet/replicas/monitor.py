"""Failure detection at a steady period, with recovery and lease expiry done beside it.

Detection is cheap (one libvirt call per replica); recovery is slow (a cold recovery boots a desktop, tens
of seconds under TCG). So each tick only detects and hands the work to a small pool of workers: one slow
recovery never delays noticing the next failure, and at most ``workers`` recoveries run at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from osfleet.replicas.periodic import PeriodicLoop

log = logging.getLogger(__name__)

MONITOR_INTERVAL_SECONDS = 1.0
RECOVERY_WORKERS = 2


class Monitor(PeriodicLoop):
    """Runs ``detect`` every ``interval`` seconds and hands what it finds to background workers.

    ``detect()`` returns replica ids due for ``recover``; ``expired()`` returns (replica, lease) pairs to
    ``expire``. A job for a replica that is already queued or running is not queued again.
    """

    def __init__(
        self,
        detect: Callable[[], list[str]],
        recover: Callable[[str], object] | None,
        expired: Callable[[], list[tuple[str, str]]],
        expire: Callable[[str, str], object],
        interval: float = MONITOR_INTERVAL_SECONDS,
        workers: int = RECOVERY_WORKERS,
    ) -> None:
        self.name = "osfleet-monitor"
        self._detect, self._recover, self._expired, self._expire = detect, recover, expired, expire
        self.interval = interval
        super().__init__()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="osfleet-recovery")
        self._inflight: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.ticks = 0
        self.last_tick = 0.0

    def stop(self, timeout: float = 300.0) -> None:
        """Stop detecting, let running jobs finish (queued ones are dropped)."""
        super().stop(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def busy(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return len(self._inflight)

    def tick(self) -> None:
        """One round of detection; never raises (a dead monitor would stop all recovery)."""
        try:
            for rid in self._detect():
                if self._recover is not None:
                    self._submit(("recover", rid), self._recover, rid)
            for rid, lease_id in self._expired():
                self._submit(("expire", rid), self._expire, rid, lease_id)
        except Exception:
            log.exception("monitor: detection failed this round")
        self.ticks += 1
        self.last_tick = time.monotonic()

    def _submit(self, key: tuple[str, str], fn: Callable[..., object], *args: str) -> None:
        with self._lock:
            if key in self._inflight or self._stop.is_set():
                return
            self._inflight.add(key)

        def job() -> None:
            try:
                fn(*args)
            except Exception as exc:
                log.warning("monitor: %s %s failed: %s", key[0], key[1], exc)
            finally:
                with self._lock:
                    self._inflight.discard(key)

        try:
            self._pool.submit(job)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._inflight.discard(key)
