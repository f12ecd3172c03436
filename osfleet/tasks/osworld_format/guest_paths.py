"""Paths and commands as OSWorld's in-VM server resolves them, for a guest without that server.

OSWorld's server runs as the desktop user in its home folder: file paths go through ``expanduser`` and
``expandvars`` (so ``~/x``, ``$HOME/x`` and a path relative to the home folder all work), and the arguments
of a command given as a list that start with ``~/`` are expanded before it runs without a shell. osfleet runs
every command through ``sh -c`` as that user in that folder, so it has to do the same expansions itself:
quoting an argument keeps the shell from expanding it, exactly as OSWorld's list commands are not expanded.
Those rules live in ``osfleet.protocol.osworld_paths`` (the OSWorld harness on a client reads commands with them
too); this module adds the placeholders of OSWorld's task files.

OSWorld's set-up also fills placeholders into a command before it runs (``{CLIENT_PASSWORD}`` and the screen's
``{SCREEN_WIDTH}``, ``{SCREEN_HEIGHT}``, ``{SCREEN_WIDTH_HALF}``, ``{SCREEN_HEIGHT_HALF}``): the password is
the image's and filled when the task is converted; the screen's are left in the command line and filled by
the runner from the replica's real screen (``fill_screen``) when the step runs. Any other ``{UPPER_CASE}``
token is a placeholder osfleet does not know: ``unknown_placeholders`` names it, and the task is refused
rather than run with the token passed on literally.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from osfleet.protocol.osworld_paths import GUEST_HOME, command_line, guest_path, truthy

__all__ = [
    "CLIENT_PASSWORD",
    "GUEST_HOME",
    "PLACEHOLDERS",
    "SCREEN_PLACEHOLDERS",
    "fill_screen",
    "guest_path",
    "needs_screen",
    "shell_command",
    "substitute",
    "truthy",
    "unknown_placeholders",
]
CLIENT_PASSWORD = "password"  # the desktop user's password on OSWorld's images (not AWS), which its tasks type


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
    """One ``sh -c`` command line doing what OSWorld's server does with ``command``
    (``osfleet.protocol.osworld_paths.command_line``), after the placeholders ``substitute`` fills: in each
    argument once a string run without a shell is split (the split is the same either way, the values have no
    quotes or spaces)."""
    if isinstance(command, str) and not truthy(shell):
        return command_line([substitute(a) for a in shlex.split(command)], shell)
    filled = substitute(command) if isinstance(command, str) else [substitute(c) for c in command]
    return command_line(filled, shell)
