"""Small statistics shared by every benchmark and the report: one percentile helper, one key spelling, the
units figures are shown in.

Distributions are reported as ``{"n", "p50", "p95", "min", "max"}`` (never ``median``); percentiles are
``statistics.quantiles`` with the inclusive method, i.e. linear interpolation between closest ranks (the
same as numpy's default).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: int) -> float:
    """The ``q``-th percentile (an integer 0..100) of a non-empty sequence, linearly interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q <= 100:
        raise ValueError(f"percentile must be an integer from 0 to 100, not {q!r}")
    if q == 0:
        return float(min(values))
    if q == 100 or len(values) == 1:
        return float(max(values))
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """``n``, ``p50``, ``p95``, ``min`` and ``max`` of a non-empty sequence: how every bench reports timings."""
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "min": float(min(values)),
        "max": float(max(values)),
    }


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it under 1024 (``1.5 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} TiB"


def seconds(s: float) -> str:
    """A duration in milliseconds under a second, else in seconds."""
    return f"{s * 1000:.2f} ms" if s < 1 else f"{s:.2f} s"
