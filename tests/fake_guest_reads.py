"""The guest's side of ``osfleet.tasks.guest_reads`` for the tests' fake guests.

osfleet reads a guest file as the desktop user with one root command (``runuser`` runs the download script as the
user, its output going to a root temporary), then the guest agent's read of that temporary, then its removal. A
fake guest whose commands run in a local shell has no user ``user`` to switch to: ``as_local_user`` turns that
command into the same script run as this process's user, so the fake's own files and permissions decide, as the
desktop user's would. A fake guest whose files are a dict answers the command itself (``answer``).
"""

from __future__ import annotations

import shlex
from typing import Any

from osfleet.replicas.guest_files import AS_USER, MISSING, TOO_LARGE

RM = "rm -f -- "


def parsed(command: str) -> tuple[str, str, int] | None:
    """(the file, the temporary, the cap) when ``command`` is osfleet's read as the desktop user."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if len(argv) != 10 or argv[:3] != ["/bin/sh", "-c", AS_USER]:
        return None
    return argv[8], argv[5], int(argv[9])


def as_local_user(command: str) -> str:
    """``command`` for a shell run as this process's user: the user's copy without ``runuser``."""
    read = parsed(command)
    if read is None:
        return command
    argv = shlex.split(command)
    path, temp, limit = read
    return f"umask 077; set -C; sh -c {shlex.quote(argv[7])} sh {shlex.quote(path)} {limit} > {shlex.quote(temp)}"


def answer(files: dict[str, bytes], command: str) -> dict[str, Any] | None:
    """The guest's answer when ``command`` is the user's copy (into ``files``) or its clean-up; else None."""
    read = parsed(command)
    if read is not None:
        path, temp, limit = read
        if path not in files:
            return {"exit_code": MISSING, "stdout": "", "stderr": ""}
        if len(files[path]) > limit:
            return {"exit_code": TOO_LARGE, "stdout": "", "stderr": ""}
        files[temp] = files[path]
        return {"exit_code": 0, "stdout": "", "stderr": ""}
    if command.startswith(RM):
        files.pop(shlex.split(command)[-1], None)
        return {"exit_code": 0, "stdout": "", "stderr": ""}
    return None
