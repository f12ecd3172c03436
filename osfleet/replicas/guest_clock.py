"""Setting a guest's clock after it was paused, fast enough for a reset.

A paused guest's clock stands still (QEMU stops the virtual clock and the TSC), so a spare resumed after a
minute is a minute behind. Starting a program in a just-resumed TCG guest (``guest-exec date -s``) costs
150-300 ms of fork, exec and page faults, most of a reset's budget. So a spare gets a *clock helper*
before it is paused: a small Python program, already started and imported, that polls for a file
(every 2 ms, which costs nothing while the guest is paused). At the reset osfleet writes the host's time
into that file through the guest agent (open, write, close: three agent round trips), the helper sets
``CLOCK_REALTIME`` and exits 0; the reset waits for that exit, so it returns with the clock right. A helper
that is gone (or a guest without python3) falls back to ``date -s`` through ``guest-exec``.
"""

from __future__ import annotations

import time

from osfleet.errors import OsfleetError
from osfleet.virt import Virt, VirtError

HELPER_DIR = "/run"
HELPER_PREFIX = "osfleet-clock."
HELPER_READY = "/run/osfleet-clock-ready"
# The request is a file whose *name* carries the host's time, so handing it over is one agent call (open).
HELPER = """
import os, time
open("/run/osfleet-clock-ready", "w").close()
while True:
    names = [n for n in os.listdir("/run") if n.startswith("osfleet-clock.")]
    if names:
        break
    time.sleep(0.002)
time.clock_settime(time.CLOCK_REALTIME, float(names[0][len("osfleet-clock."):]))
for n in names + ["osfleet-clock-ready"]:
    os.unlink("/run/" + n)
os._exit(0)
"""
POLL_SECONDS = 0.003
READY_TIMEOUT_SECONDS = 30.0
SET_TIMEOUT_SECONDS = 10.0


def start_helper(virt: Virt, domain: str, timeout: float = READY_TIMEOUT_SECONDS) -> int:
    """Start the clock helper in a running guest and wait until it polls; returns its pid."""
    started = virt.agent(domain, "guest-exec", {"path": "/usr/bin/python3", "arg": ["-c", HELPER]})
    pid = int(started["pid"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = virt.agent(domain, "guest-exec-status", {"pid": pid})
        if status.get("exited"):
            raise OsfleetError(f"{domain}: the clock helper exited early ({status.get('exitcode')})")
        if _exists(virt, domain, HELPER_READY):
            return pid
        time.sleep(0.05)
    raise OsfleetError(f"{domain}: the clock helper was not ready within {timeout:.0f} s")


def trigger(virt: Virt, domain: str) -> None:
    """Hand the host's time to the helper: one file created, its name the time; the helper sets the clock
    as soon as it sees it."""
    path = f"{HELPER_DIR}/{HELPER_PREFIX}{time.time():.6f}"
    handle = virt.agent(domain, "guest-file-open", {"path": path, "mode": "w"})
    virt.agent(domain, "guest-file-close", {"handle": handle})


def wait_done(virt: Virt, domain: str, pid: int, timeout: float = SET_TIMEOUT_SECONDS) -> None:
    """Wait until the helper has set the clock and exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = virt.agent(domain, "guest-exec-status", {"pid": pid})
        if status.get("exited"):
            if status.get("exitcode", 0) != 0 or "signal" in status:
                raise OsfleetError(f"{domain}: the clock helper failed (exit {status.get('exitcode')})")
            return
        time.sleep(POLL_SECONDS)
    raise OsfleetError(f"{domain}: the clock was not set within {timeout:.0f} s")


def set_now(virt: Virt, domain: str, helper: int | None) -> None:
    """Set the guest clock to the host's: through the helper when there is one, else ``date -s``."""
    if helper is not None:
        try:
            trigger(virt, domain)
            wait_done(virt, domain, helper)
            return
        except (OsfleetError, KeyError):
            pass  # the slower way below still sets it
    started = virt.agent(domain, "guest-exec", {"path": "/bin/date", "arg": ["-u", "-s", f"@{time.time():.3f}"]})
    wait_done(virt, domain, int(started["pid"]))


def _exists(virt: Virt, domain: str, path: str) -> bool:
    try:
        handle = virt.agent(domain, "guest-file-open", {"path": path, "mode": "r"})
    except VirtError:
        return False
    virt.agent(domain, "guest-file-close", {"handle": handle})
    return True
