"""The warm pool: keeps a number of replicas ready (or on their way) so a lease never waits for a boot."""

from __future__ import annotations

import logging
from collections.abc import Callable

from osfleet.replicas.periodic import PeriodicLoop

log = logging.getLogger(__name__)

POOL_INTERVAL_SECONDS = 0.2
BACKOFF_SECONDS = 5.0


class WarmPool(PeriodicLoop):
    """Calls ``create()`` while ``coming()`` (replicas ready, booting or provisioning) is below ``target``."""

    name = "osfleet-pool"
    interval = POOL_INTERVAL_SECONDS

    def __init__(self, target: int, coming: Callable[[], int], create: Callable[[], object]) -> None:
        super().__init__()
        self.target = target
        self._coming = coming
        self._create = create

    def tick(self) -> None:
        try:
            if self._coming() < self.target:
                self._create()
        except Exception as exc:  # a failed bring-up must not end the pool: try again a bit later
            log.warning("warm pool: %s", exc)
            self._stop.wait(BACKOFF_SECONDS)
