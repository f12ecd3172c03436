"""Waiting until a desktop stops drawing, with a bound: ``{"type": "wait", "until": "quiet", "seconds": 5}``.

An agent that launches an application or submits a form does not know how long the desktop will take to draw the
result (under emulation: seconds, varying with the host's load), so it sleeps a fixed time chosen for the worst
case and pays it on every step. A quiet wait instead returns once the screen has not changed for
``quiet_seconds``, or at ``seconds`` at the latest.

How the screen is watched: a capture every ``POLL_SECONDS`` (a third of the quiet window when that is shorter),
compared with the one before by what the capture keeps of the last frame (``capture.Frame.fingerprint``), so a
poll costs a screendump and a row compare, no encode. The window starts at the wait: a screen still since before
the call waits one whole window, because a capture cannot tell how long it has been still. A caret that blinks
(GTK: every 0.6 s) leaves gaps longer than the default window of 0.5 s, so it does not keep a wait from ending;
a video or an animation does, and the bound ends the wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

POLL_SECONDS = 0.1

Fingerprint = Callable[[], Hashable]
"""The screen now, as something equal exactly when the pixels are (``capture.Frame.fingerprint``)."""


def wait_until_quiet(
    fingerprint: Fingerprint,
    bound: float,
    quiet: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until the screen has been unchanged for ``quiet`` seconds (True) or ``bound`` seconds have passed
    (False, when it was still changing); ``clock`` and ``sleep`` are the real ones but in tests."""
    start = clock()
    deadline = start + bound
    last = fingerprint()
    still_since = clock()
    interval = max(0.001, min(POLL_SECONDS, quiet / 3))
    while True:
        now = clock()
        if now - still_since >= quiet:
            return True
        if now >= deadline:
            return False
        sleep(max(0.0, min(interval, deadline - now, still_since + quiet - now)))
        current = fingerprint()
        if current != last:
            last, still_since = current, clock()
