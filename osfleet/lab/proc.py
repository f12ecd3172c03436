"""Running the system tools the lab needs (ip, sshd, ssh-keygen), each failure as one readable line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from osfleet.errors import CommandFailedError, MissingToolError

TOOLS = {"ip": "iproute2", "sshd": "openssh-server", "ssh-keygen": "openssh-client"}
SSHD = "/usr/sbin/sshd"


def run(argv: list[str], what: str, timeout: float = 30.0) -> str:
    """Run ``argv`` (never through a shell); return stdout or raise with the tool's own last error line."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        tool = Path(argv[0]).name
        raise MissingToolError(tool, TOOLS.get(tool), where="localhost") from None
    except subprocess.TimeoutExpired:
        raise CommandFailedError(f"{what}: {argv[0]} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise CommandFailedError(f"{what} failed: {lines[-1] if lines else f'exit status {done.returncode}'}")
    return done.stdout


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def stop(pids: list[int], grace: float = 5.0) -> list[int]:
    """SIGTERM each pid, SIGKILL what is left after ``grace`` seconds; return the pids that were signalled."""
    signalled = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in signalled):
        time.sleep(0.05)
    for pid in signalled:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in signalled):
        time.sleep(0.05)
    return signalled
