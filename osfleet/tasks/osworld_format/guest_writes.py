"""Writing a host file into a guest through the guest agent's command channel (no network, no shared folder).

The bytes go as base64 in ``sh -c`` arguments, a chunk per command (an argument must stay under the
kernel's 128 KiB limit), into a temporary name that is renamed at the end, so a task never sees half a
file. Files in the desktop user's home or /tmp are written as that user (they own what they can edit);
anywhere else as root.

It writes what OSWorld's set-up puts into a guest: a ``download`` step's file from the asset store
(``put_file``) and an ``execute`` step's output in the task cache (``put_text``, ``CACHE_DIR``). A client's own
files go in and out through ``osfleet.replicas.guest_files`` instead, always as the desktop user.
"""

from __future__ import annotations

import base64
import itertools
import shlex
import tempfile
import time
from pathlib import Path, PurePosixPath

from osfleet.errors import OsfleetError
from osfleet.replicas.actions import GUEST_USER
from osfleet.tasks.osworld_format.guest_query import GuestShell

RAW_CHUNK_BYTES = 48 * 1024  # 64 KiB of base64 per command
# OSWorld's per-task cache (``execute``'s ``stdout``/``stderr`` files, read back by ``cache_file``), kept in the
# guest so it starts empty with every reset; root's, so the agent (the desktop user) cannot rewrite it.
CACHE_DIR = "/var/lib/osfleet-task-cache"


class GuestWriteError(OsfleetError):
    """A file could not be written into the guest."""


def _as_user(path: str) -> bool:
    p = PurePosixPath(path)
    return any(p.is_relative_to(d) for d in (PurePosixPath(f"/home/{GUEST_USER}"), PurePosixPath("/tmp")))


def put_text(host: GuestShell, rid: str, path: str, text: str, timeout: float) -> None:
    """Write ``text`` (UTF-8) to ``path`` in the guest, as ``put_file`` does."""
    with tempfile.TemporaryDirectory(prefix="osfleet-put-") as tmp:
        source = Path(tmp) / "text"
        source.write_text(text, encoding="utf-8")
        put_file(host, rid, path, source, timeout)


def put_file(host: GuestShell, rid: str, path: str, source: Path, timeout: float) -> None:
    """Copy ``source`` to ``path`` in the guest, creating its folder; all commands share ``timeout``."""
    deadline = time.monotonic() + timeout
    as_root = not _as_user(path)
    target, part = shlex.quote(path), shlex.quote(f"{path}.osfleet-part")
    folder = shlex.quote(str(PurePosixPath(path).parent))

    def run(command: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GuestWriteError(f"writing {path} did not finish within {timeout:.0f} s")
        out = host.shell(rid, command, left, as_root)
        if out["exit_code"] != 0:
            detail = (out["stderr"] or out["stdout"]).strip().splitlines()
            raise GuestWriteError(f"cannot write {path}: {detail[-1] if detail else 'exit ' + str(out['exit_code'])}")

    with source.open("rb") as f:
        chunks = iter(lambda: f.read(RAW_CHUNK_BYTES), b"")
        first = next(chunks, b"")
        # Under TCG each guest command costs about a second, so a file of one chunk (most task inputs) is
        # written, and renamed, by one command.
        head = f"mkdir -p {folder} && printf %s {base64.b64encode(first).decode()} | base64 -d > {part}"
        second = next(chunks, b"")
        if not second:
            run(f"{head} && mv -f {part} {target}")
            return
        run(head)
        for chunk in itertools.chain([second], chunks):
            run(f"printf %s {base64.b64encode(chunk).decode()} | base64 -d >> {part}")
    run(f"mv -f {part} {target}")
