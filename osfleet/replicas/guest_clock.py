"""Setting a guest's clock after it was paused, fast enough for a reset or a lease.

A paused guest's clock stands still (QEMU stops the virtual clock and the TSC; under TCG there is no
paravirtual clock to catch up from), so a spare resumed after a minute is a minute behind. The resident
helper every snapshot guest runs (``osfleet.replicas.guest_helper``) sets it from one line on the control
port: a few milliseconds in a resumed guest, where ``guest-exec date -s`` costs a process start (150-300
ms just after a restore). A replica without the helper's port (made by an older osfleet, then adopted)
is set through the guest agent.
"""

from __future__ import annotations

import time
from pathlib import Path

from osfleet.errors import OsfleetError
from osfleet.replicas import guest_control
from osfleet.replicas.guest_control import ControlError
from osfleet.vm.virt import Virt

POLL_SECONDS = 0.01
SET_TIMEOUT_SECONDS = 10.0


def set_now(virt: Virt, domain: str, control: Path | None = None) -> None:
    """Set the guest clock to the host's; ``control``: the domain's control socket when already known."""
    try:
        guest_control.set_time(control or guest_control.socket_path(virt, domain), SET_TIMEOUT_SECONDS)
        return
    except ControlError:
        pass  # no helper behind the port: the guest agent below still sets it
    started = virt.agent(domain, "guest-exec", {"path": "/bin/date", "arg": ["-u", "-s", f"@{time.time():.3f}"]})
    pid = int(started["pid"])
    deadline = time.monotonic() + SET_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        status = virt.agent(domain, "guest-exec-status", {"pid": pid})
        if status.get("exited"):
            if status.get("exitcode", 0) != 0 or "signal" in status:
                raise OsfleetError(f"{domain}: date -s failed (exit {status.get('exitcode')})")
            return
        time.sleep(POLL_SECONDS)
    raise OsfleetError(f"{domain}: the clock was not set within {SET_TIMEOUT_SECONDS:.0f} s")
