"""One build (or publish) at a time per image folder, on the host that holds the folder.

Two builds of one recipe into one folder, started together, both built and both renamed their files into place:
the image's name was published twice, with other bytes the second time, under host agents that had already saved
a running state of the first (``osfleet.replicas.saved_state``). So a build or a publish holds the folder's lock
from its checks to its last rename, and a second one waits: it says whose lock it waits for and how long, and
once it holds the lock it looks again, so a second build of the same recipe finds the first one's image (a
cache hit) instead of building it again. Waiting is what a user expects of a second terminal (as ``apt`` and
``cargo`` wait for their locks); Ctrl-C stops the waiting build and leaves the first alone.

How: ``flock(1)`` on the folder itself, held by a small command started on the host (``Host.start``) that keeps
the lock until its stdin closes: we close it when done, and so does the end of this process or of its SSH
connection, so a lock is never left behind by a killed build. The holder writes who it is into
``OWNER_FILE`` in the folder, read by the builds that wait, and removes it before it lets go.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from shlex import quote as q

from osfleet.errors import CommandFailedError
from osfleet.imaging.host import Host

OWNER_FILE = ".osfleet-lock-owner"
# How long one wait lasts on the host before the waiting build says again that it waits.
WAIT_SAY_SECONDS = 30
BUSY = 75  # flock's exit status when the lock stayed taken (``-E``)
LOCKED = "locked"


def holder_command(folder: str, who: str, wait_seconds: int) -> str:
    """The command that takes ``folder``'s lock (waiting up to ``wait_seconds``), names its holder, prints
    ``LOCKED`` and keeps the lock until its stdin closes."""
    owner = f"{folder.rstrip('/')}/{OWNER_FILE}"
    # SIGPIPE ignored: a holder whose reader is gone (killed while it waited) still removes the owner file.
    keep = 'trap "" PIPE; printf "%s\\n" "$1" > "$2" && echo ' + LOCKED + ' && cat > /dev/null; rm -f "$2"'
    return f"exec flock -E {BUSY} -w {int(wait_seconds)} {q(folder)} sh -c {q(keep)} osfleet-lock {q(who)} {q(owner)}"


def holder(folder: str, host: Host) -> str:
    """Who holds ``folder``'s lock, as that holder wrote it (or a plain phrase when it has not yet)."""
    owner = f"{folder.rstrip('/')}/{OWNER_FILE}"
    text = host.run(f"cat {q(owner)} 2>/dev/null; true").strip()
    return text.splitlines()[0] if text else "another process"


@contextmanager
def folder_lock(host: Host, folder: str, what: str) -> Iterator[None]:
    """Hold the lock of ``folder`` (it must exist) on ``host`` while the block runs; ``what`` says to a waiting
    build what this one does. Waits for a holder, saying so every ``WAIT_SAY_SECONDS``; interruptible."""
    who = f"{what}, pid {os.getpid()} of {getpass.getuser()} on {socket.gethostname()} since {_now()}"
    waited_since: float | None = None
    while True:
        running = host.start(holder_command(folder, who, 0 if waited_since is None else WAIT_SAY_SECONDS))
        try:
            line = running.readline()
            if line.strip() == LOCKED:
                break
            status = running.finish()
        except BaseException:
            running.stop()
            raise
        if status != BUSY:
            reason = running.last_error() or f"exit status {status}"
            raise CommandFailedError(f"{host.name}: cannot lock {folder}: {reason}")
        if waited_since is None:
            waited_since = time.monotonic()
            host.say(f"waiting for the lock of {folder}, held by: {holder(folder, host)} (Ctrl-C to stop waiting)")
        else:
            host.say(f"      ... still waiting for {folder} after {time.monotonic() - waited_since:.0f} s")
    if waited_since is not None:
        host.say(f"got the lock of {folder} after {time.monotonic() - waited_since:.0f} s")
    try:
        yield
    finally:
        running.finish()


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
