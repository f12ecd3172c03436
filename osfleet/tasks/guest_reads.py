"""Reading a guest file as the desktop user, for a task's checks and getters.

The guest agent reads files as root. A path a getter takes from the agent's work (a wallpaper's URI, a slide's
linked file, a link the agent made in its home) or one a client's task names (``/etc/shadow``) must not become a
way to read what the desktop user cannot, and a check "the user can read it" followed by a root read leaves a
race (a link swapped in between). So the desktop user's own process opens the file: as root, the guest runs the
download script of ``osfleet.replicas.guest_files`` as the user (``runuser``, the verifier's fixed environment),
with its output going to a fresh root-owned temporary (mode 0600, made exclusively, the name random); the guest
agent then reads that copy, bounded in bytes and time like every read from a guest, and the temporary is removed
whatever happens. The path reaches the guest as an argument, never in a command's text.

What the user has no such file for is ``None``; a file it may not read, or that is not a regular file, raises
``GuestReadRefused`` (whose message names the path and why, never a byte of it), and so does a copy that failed
some other way in the guest (the guest's doing, not the host's); a file over ``limit`` raises
``GuestFileTooLargeError``: a check is never scored on a copy cut short. A guest that cannot be reached raises
as every guest call does (an infrastructure failure).
"""

from __future__ import annotations

import contextlib
import secrets
import shlex
from typing import Any, Protocol

from osfleet.errors import GuestFileTooLargeError, OsfleetError
from osfleet.replicas.actions import GUEST_USER
from osfleet.replicas.guest_files import AS_USER, DENIED, MISSING, NOT_REGULAR, READ, TEMP_PREFIX, TOO_LARGE

CLEANUP_SECONDS = 10.0


class GuestAccess(Protocol):
    """What reading a guest file needs of a replica host (``ReplicaHost`` has it; tests give a fake): the getters'
    view of one (``osfleet.tasks.osworld_format.getters``) and the runner's checks."""

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]: ...

    def read_file(self, replica_id: str, path: str, limit: int) -> bytes: ...


class GuestReadRefused(OsfleetError):
    """The desktop user may not read this guest file, or it is not a regular file."""


def read_as_user(host: GuestAccess, rid: str, path: str, limit: int, timeout: float) -> bytes | None:
    """The whole guest file ``path`` as the desktop user reads it, within ``timeout`` seconds for the copy (the
    read and the clean-up get the host's own bounds); None when the user sees no file there."""
    temp = TEMP_PREFIX + secrets.token_hex(16)
    command = shlex.join(["/bin/sh", "-c", AS_USER, "sh", "/dev/null", temp, GUEST_USER, READ, path, str(limit)])
    try:
        out = host.shell(rid, command, timeout, as_root=True)
        code = out["exit_code"]
        if code == 0:
            try:
                return host.read_file(rid, temp, limit)
            except GuestFileTooLargeError:  # grown since the user measured it: the same refusal
                code = TOO_LARGE
    finally:
        with contextlib.suppress(OsfleetError):  # a guest that does not answer keeps it (root's, mode 0600)
            host.shell(rid, f"rm -f -- {shlex.quote(temp)}", min(CLEANUP_SECONDS, max(timeout, 1.0)), as_root=True)
    if code == MISSING:
        return None
    if code == NOT_REGULAR:
        raise GuestReadRefused(f"{path} is not a regular file")
    if code == DENIED:
        raise GuestReadRefused(f"the desktop user may not read {path}")
    if code == TOO_LARGE:
        cap = f"{limit / 2**20:g} MiB" if limit >= 2**20 else f"{limit} bytes"
        raise GuestFileTooLargeError(f"file over {cap}: {path}")
    said = (out["stderr"] or "").strip().splitlines()
    # The user's own copy failed some other way (a guest out of processes, an I/O error): the guest's doing, so the
    # check or getter gets no value (a 0 with this reason), not an infrastructure error.
    raise GuestReadRefused(f"reading {path} as the desktop user failed (exit {code}): {said[-1][:200] if said else ''}")
