"""Paths and commands as OSWorld's in-VM server resolves them, for a guest without that server.

OSWorld's server runs as the desktop user in its home folder: file paths go through ``expanduser`` and
``expandvars`` (so ``~/x``, ``$HOME/x`` and a path relative to the home folder all work), and the arguments
of a command given as a list that start with ``~/`` are expanded before it runs without a shell. osfleet runs
every command through ``sh -c`` as that user in that folder, so it has to do the same expansions itself:
quoting an argument keeps the shell from expanding it, exactly as OSWorld's list commands are not expanded.

OSWorld's set-up also fills placeholders into a command before it runs (``{CLIENT_PASSWORD}`` and the screen's
``{SCREEN_WIDTH}``, ``{SCREEN_HEIGHT}``, ``{SCREEN_WIDTH_HALF}``, ``{SCREEN_HEIGHT_HALF}``): the password is
the image's and filled when the task is converted; the screen's are left in the command line and filled by
the runner from the replica's real screen (``fill_screen``) when the step runs. Any other ``{UPPER_CASE}``
token is a placeholder osfleet does not know: ``unknown_placeholders`` names it, and the task is refused
rather than run with the token passed on literally.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any

from osfleet.replicas.actions import GUEST_USER

GUEST_HOME = f"/home/{GUEST_USER}"
CLIENT_PASSWORD = "password"  # the desktop user's password on OSWorld's images (not AWS), which its tasks type
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


SCREEN_PLACEHOLDERS = ("{SCREEN_WIDTH_HALF}", "{SCREEN_HEIGHT_HALF}", "{SCREEN_WIDTH}", "{SCREEN_HEIGHT}")
PLACEHOLDERS = ("{CLIENT_PASSWORD}", *SCREEN_PLACEHOLDERS)
# An upper-case word in braces, not a shell's ${VAR}: what OSWorld's task files use for a placeholder.
_PLACEHOLDER = re.compile(r"(?<!\$)\{[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*\}")


def substitute(text: str) -> str:
    """OSWorld's set-up placeholders that do not depend on the running desktop."""
    return text.replace("{CLIENT_PASSWORD}", CLIENT_PASSWORD)


def unknown_placeholders(text: str) -> list[str]:
    """The ``{UPPER_CASE}`` tokens of ``text`` that are not one of OSWorld's placeholders (in order, once)."""
    return list(dict.fromkeys(t for t in _PLACEHOLDER.findall(text) if t not in PLACEHOLDERS))


def needs_screen(text: str) -> bool:
    """Whether ``text`` has a screen placeholder left for ``fill_screen``."""
    return any(p in text for p in SCREEN_PLACEHOLDERS)


def fill_screen(text: str, width: int, height: int) -> str:
    """The screen placeholders of ``text`` filled as OSWorld fills them (halves rounded down), the longer names
    first so ``{SCREEN_WIDTH_HALF}`` is not read as ``{SCREEN_WIDTH}`` followed by text. The values are digits,
    so filling a command line already quoted for the shell keeps its quoting intact."""
    for name, value in (
        ("{SCREEN_WIDTH_HALF}", width // 2),
        ("{SCREEN_HEIGHT_HALF}", height // 2),
        ("{SCREEN_WIDTH}", width),
        ("{SCREEN_HEIGHT}", height),
    ):
        text = text.replace(name, str(int(value)))
    return text


def shell_command(command: str | list[str], shell: Any = False) -> str:
    """One ``sh -c`` command line doing what OSWorld's server does with ``command``.

    With ``shell`` a string runs as it is and a list runs its first item with the rest as ``$0``, ``$1``... (what
    ``subprocess.run(list, shell=True)`` does); without it a string is split like ``shlex.split`` and every
    argument is passed literally, except a leading ``~/`` (expanded to the home folder, as OSWorld does)."""
    if truthy(shell):
        if isinstance(command, str):
            return substitute(command)
        head, *rest = [substitute(c) for c in command]
        return shlex.join(["sh", "-c", head, *rest]) if rest else head
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    return " ".join(_expanded(substitute(a)) for a in argv)
