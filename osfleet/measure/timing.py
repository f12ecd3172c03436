"""Where a request's time goes, by stage, reported to the client as an HTTP ``Server-Timing`` header.

An endpoint opens ``collecting()``; code below it (the replica library, the recorder) wraps its work in
``stage("capture")`` etc. without being handed anything: the stages of the current request are found through
a context variable, and outside a request ``stage`` only runs its block. A stage entered twice adds up.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar

_current: ContextVar[Stages | None] = ContextVar("osfleet_stages", default=None)
_METRIC = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:;(.*))?$")


class Stages:
    """Seconds per named stage, in the order first entered; ``total`` is from creation to ``finish``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()
        self.total: float | None = None

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def finish(self) -> float:
        self.total = time.perf_counter() - self._start
        return self.total

    def header(self) -> str:
        """``Server-Timing`` value: ``act;dur=12.3, capture;dur=25.0, ..., total;dur=41.0`` (milliseconds)."""
        items = [*self.seconds.items(), *([("total", self.total)] if self.total is not None else [])]
        return ", ".join(f"{name};dur={s * 1000:.1f}" for name, s in items)


@contextmanager
def collecting() -> Iterator[Stages]:
    """Collect the stages of the work done inside (in this thread) into a new ``Stages``."""
    stages = Stages()
    token = _current.set(stages)
    try:
        yield stages
    finally:
        stages.finish()
        _current.reset(token)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the block as stage ``name`` of the current request, if one is collecting."""
    stages = _current.get()
    if stages is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        stages.add(name, time.perf_counter() - start)


def parse_server_timing(value: str | None) -> dict[str, float]:
    """Seconds per metric from a ``Server-Timing`` header (metrics without ``dur`` are left out)."""
    out: dict[str, float] = {}
    for item in (value or "").split(","):
        m = _METRIC.match(item)
        if not m:
            continue
        for param in (m.group(2) or "").split(";"):
            key, _, raw = param.partition("=")
            if key.strip() == "dur":
                with suppress(ValueError):
                    out[m.group(1)] = out.get(m.group(1), 0.0) + float(raw.strip().strip('"')) / 1000
    return out
