"""A background thread that runs one round of work every ``interval`` seconds until stopped.

The monitor and the warm pool are both such loops; ``alive()`` is what ``/health`` looks at.
"""

from __future__ import annotations

import threading


class PeriodicLoop:
    """Subclasses implement ``tick()``; it must not raise (a dead loop is reported by ``alive()``)."""

    name = "osfleet-loop"
    interval = 1.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 300.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        raise NotImplementedError
