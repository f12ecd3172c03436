"""OSWorld's ``pyautogui`` action space, run in the guest as OSWorld's own server runs it.

An OSWorld agent's action is a string of Python that calls ``pyautogui``. OSWorld runs it as
``python -c "import pyautogui; import time; pyautogui.FAILSAFE = False; <code>"`` in the VM; here the same
command runs through the guest agent as the desktop user on its display (``actions.shell``), under the guest's
own ``timeout -s KILL`` so code that runs past its deadline is killed with its whole process group and the
replica goes on. Its output is returned; code that raises fails that action with the exception's last line.

pyautogui on X types ``<`` as ``>`` (the key it picks for ``<`` is the 102nd key, whose shifted symbol is ``>``):
OSWorld rewrites ``press('<')`` and ``<`` inside ``typewrite(...)`` to shift+comma before running the code.
``fix_less_than`` does the same (also for ``write``, pyautogui's other name for ``typewrite``), on the parsed
code rather than with a regular expression, so escapes and quotes inside the string do not throw it off.
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Callable
from typing import Any

from osfleet.errors import OsfleetError

PRELUDE = "import pyautogui; import time; pyautogui.FAILSAFE = False\n"
LESS_THAN = "pyautogui.hotkey('shift', ',')"
_TYPING = ("typewrite", "write")
ERROR_CHARS = 2000


class CodeFailedError(OsfleetError):
    """The agent's code ran and failed (an exception, a non-zero exit): that action's error, with its output."""

    def __init__(self, message: str, output: dict[str, Any]) -> None:
        super().__init__(message)
        self.output = output


def _pyautogui_call(node: ast.AST, names: tuple[str, ...]) -> str | None:
    """The constant string a ``pyautogui.<name>('...')`` call with that one argument types, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names):
        return None
    if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "pyautogui"):
        return None
    if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
        return None
    return node.args[0].value


def _typing_with_less_than(node: ast.Call, text: str, source: str) -> str:
    """One expression that types ``text`` in pieces with shift+comma for each ``<`` (the call's keyword
    arguments, e.g. ``interval``, kept on every piece)."""
    func = ast.get_source_segment(source, node.func) or "pyautogui.typewrite"
    kwargs = "".join(", " + (ast.get_source_segment(source, k) or "") for k in node.keywords)
    parts: list[str] = []
    for i, piece in enumerate(text.split("<")):
        if i:
            parts.append(LESS_THAN)
        if piece:
            parts.append(f"{func}({piece!r}{kwargs})")
    return "(" + ", ".join(parts) + ",)"


def fix_less_than(code: str) -> str:
    """``code`` with every ``<`` that pyautogui would type as ``>`` sent as shift+comma (see the module's docstring).
    Code that does not parse is returned unchanged: Python will report its syntax error itself."""
    if "<" not in code and "\\u003c" not in code and "\\x3c" not in code:
        return code
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.end_lineno is None or node.end_col_offset is None:
            continue
        pressed = _pyautogui_call(node, ("press",))
        typed = _pyautogui_call(node, _TYPING)
        if pressed == "<" and not node.keywords:
            new = LESS_THAN
        elif typed is not None and "<" in typed:
            new = _typing_with_less_than(node, typed, code)
        else:
            continue
        start = offsets[node.lineno - 1] + _char_offset(lines[node.lineno - 1], node.col_offset)
        end = offsets[node.end_lineno - 1] + _char_offset(lines[node.end_lineno - 1], node.end_col_offset)
        edits.append((start, end, new))
    for start, end, new in sorted(edits, reverse=True):  # calls never nest inside a rewritten one's string
        code = code[:start] + new + code[end:]
    return code


def _char_offset(line: str, utf8_offset: int) -> int:
    """ast's column offsets count UTF-8 bytes; the string is indexed by characters."""
    return len(line.encode()[:utf8_offset].decode(errors="ignore"))


def command_line(code: str) -> str:
    """The guest shell command that runs ``code`` as OSWorld does (after ``fix_less_than``)."""
    return "exec python3 -c " + shlex.quote(PRELUDE + fix_less_than(code))


def run(shell: Callable[[str, float], dict[str, Any]], code: str, timeout: float) -> dict[str, Any]:
    """Run the agent's code with ``shell`` (a guest command as the desktop user, ``actions.shell``); its output,
    or ``CodeFailedError`` with it when the code failed. Code still running after ``timeout`` seconds is killed
    (``GuestTimeoutError``)."""
    out = shell(command_line(code), timeout)
    if out["exit_code"] != 0:
        lines = [x for x in (out.get("stderr") or "").strip().splitlines() if x.strip()]
        reason = lines[-1] if lines else f"exit status {out['exit_code']}"
        raise CodeFailedError(f"the code failed: {reason[:ERROR_CHARS]}", out)
    return out
