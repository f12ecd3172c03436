"""Rewards a policy cannot print: every metric's value is a finite number in [0, 1], or it scores 0 saying why.

Trainers assume rewards in [0, 1]. A value outside it is either a metric that returns something else (OSWorld's
``run_sqlite3`` returns its query's number, whatever it is) or the work of whatever the metric read: a test
suite's answer was once the agent's own ``print('{"score": 1e300}')``. Such a value scores 0 with the value named,
never clamped (a clamp would turn 1e300 into a perfect score), and so do NaN, infinities and anything that is not
a number.

``value`` is the one place that judges a metric's value: the evaluation sandbox gives it every metric's answer
(``osfleet.tasks.jail.sandbox``: no metric runs anywhere else), so osfleet's own criteria and OSWorld's format
alike get their values from it. The rest of the arithmetic keeps the range: a criterion is met or not, weights
are finite and positive (``osfleet.protocol.tasks.Criterion``), and a weighted share, a mean or a maximum of
numbers in [0, 1] is in [0, 1].
"""

from __future__ import annotations

import math


def value(what: str, raw: object) -> tuple[float, str | None]:
    """``raw`` as a score and None when it is a finite number in [0, 1] (a bool counts as 0 or 1); else 0.0 and
    the reason, which names ``what`` gave it."""
    if isinstance(raw, bool):
        return float(raw), None
    if isinstance(raw, int) and 0 <= raw <= 1:  # (an int too large for a float is compared exactly)
        return float(raw), None
    if isinstance(raw, float) and math.isfinite(raw) and 0.0 <= raw <= 1.0:
        return raw, None
    if isinstance(raw, float):
        shown = repr(raw)
    elif isinstance(raw, int):
        shown = repr(raw) if abs(raw) < 10**30 else "an integer of more than 30 digits"
    else:
        shown = f"a {type(raw).__name__}"
    return 0.0, f"{what} gave {shown}, not a number in [0, 1]: scored 0"
