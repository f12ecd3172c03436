"""Paths and command lines as OSWorld's in-VM server reads them, for a guest that runs everything through ``sh``.

OSWorld's server runs as the desktop user in its home folder. It puts a file path through ``expanduser`` and
``expandvars`` (``~/x``, ``$HOME/x`` and a path relative to the home folder all work), and it runs a command
given as a list without a shell, after expanding the arguments that start with ``~/``. osfleet runs every guest
command through ``sh -c`` as that user in that folder, so these functions do the same expansions and quote the
rest: quoting keeps the shell from expanding an argument, exactly as OSWorld's list commands are not expanded.

Shared by the host (the OSWorld task converter, ``osfleet.tasks.osworld_format.guest_paths``) and the client (the
OSWorld harness, ``osfleet.osworld``), so the two read a command the same way; like the rest of this package it
imports nothing from the rest of osfleet.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any

GUEST_USER = "user"  # the desktop user of osfleet's images, as on OSWorld's
GUEST_HOME = f"/home/{GUEST_USER}"
_VARS = {"HOME": GUEST_HOME, "USER": GUEST_USER, "LOGNAME": GUEST_USER}
_VAR = re.compile(r"\$(\w+)|\$\{([^}]*)\}")


def guest_path(path: str) -> str:
    """``path`` as an absolute guest path: ``~``/``~user``, ``$HOME``-style variables, then the home folder
    for a relative path (variables the desktop user's environment lacks stay as they are, as expandvars does)."""
    if path == "~" or path.startswith("~/"):
        path = GUEST_HOME + path[1:]
    elif path.startswith("~"):
        user, _, rest = path[1:].partition("/")
        home = GUEST_HOME if user == GUEST_USER else ("/root" if user == "root" else None)
        if home is not None:
            path = f"{home}/{rest}" if rest else home
    path = _VAR.sub(lambda m: _VARS.get(m.group(1) or m.group(2), m.group(0)), path)
    return path if path.startswith("/") else posixpath.join(GUEST_HOME, path)


def truthy(value: Any) -> bool:
    """OSWorld passes ``shell`` straight to subprocess, so any truthy value (task files write ``"true"``) counts."""
    return bool(value)


def _expanded(arg: str) -> str:
    return f'"$HOME"/{shlex.quote(arg[2:])}' if arg.startswith("~/") else shlex.quote(arg)


def command_line(command: str | list[str], shell: Any = False) -> str:
    """One ``sh -c`` command line doing what OSWorld's server does with ``command``.

    With ``shell`` a string runs as it is and a list runs its first item with the rest as ``$0``, ``$1``... (what
    ``subprocess.run(list, shell=True)`` does); without it a string is split like ``shlex.split`` (``ValueError``
    for one it cannot split, an open quote) and every argument is passed literally, except a leading ``~/``
    (expanded to the home folder, as OSWorld does)."""
    if truthy(shell):
        if isinstance(command, str):
            return command
        head, *rest = command
        return shlex.join(["sh", "-c", head, *rest]) if rest else head
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    return " ".join(_expanded(a) for a in argv)
