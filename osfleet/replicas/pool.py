"""The warm pool: keeps a number of replicas ready (or on their way) so a lease never waits for a boot."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

POOL_INTERVAL_SECONDS = 0.2
BACKOFF_SECONDS = 5.0


class WarmPool:
    """Calls ``create()`` while ``coming()`` (replicas ready, booting or provisioning) is below ``target``."""

    def __init__(self, target: int, coming: Callable[[], int], create: Callable[[], object]) -> None:
        self.target = target
        self._coming = coming
        self._create = create
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="osfleet-pool", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 300.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        while not self._stop.wait(POOL_INTERVAL_SECONDS):
            try:
                if self._coming() < self.target:
                    self._create()
            except Exception as exc:  # a failed bring-up must not end the pool: try again a bit later
                log.warning("warm pool: %s", exc)
                self._stop.wait(BACKOFF_SECONDS)
