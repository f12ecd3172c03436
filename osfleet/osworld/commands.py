"""The guest command lines behind OSWorld's endpoints, as text for osfleet's ``shell`` action.

osfleet's ``shell`` action runs ``sh -c`` as the desktop user (``user``), in its home folder, on its display
(``DISPLAY=:0``), under the guest's ``timeout -s KILL``, which is where OSWorld's server runs its subprocesses.
What the request carries (a path, a window name, code) reaches the command line only through ``shlex.quote``,
never as text the shell reads. Commands run with no shell in OSWorld (a list, ``shell`` false) are quoted
argument by argument (``osfleet.protocol.osworld_paths.command_line``).

Where an endpoint must tell the guest's own failure (a missing working folder) from the command's result, the
command line writes a fixed marker to its own stderr, which nothing else in that command line writes to.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence

from osfleet.protocol.actions import PYAUTOGUI_SPECIAL
from osfleet.protocol.osworld_paths import command_line

# What OSWorld's PythonController puts before an agent's pyautogui code (its ``pkgs_prefix``), run as
# ``["python", "-c", PREFIX + code]``: a request in exactly this form is the agent's action, sent to osfleet as its
# ``pyautogui`` action (same prelude, run as OSWorld runs it) rather than as a bare shell command.
OSWORLD_PYAUTOGUI_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
MARKER = "osfleet-osworld-harness:"
NO_WORKING_DIR = MARKER + "no-working-dir"
NO_SUCH_PATH = MARKER + "no-such-path"
BASH_SHEBANG = "#!/bin/bash"


def pyautogui_code(command: object) -> str | None:
    """The agent's code when ``command`` is OSWorld's pyautogui form (see ``OSWORLD_PYAUTOGUI_PREFIX``), else None."""
    if not (isinstance(command, list) and len(command) == 3 and all(isinstance(c, str) for c in command)):
        return None
    program, flag, text = command
    if program not in ("python", "python3") or flag != "-c" or not text.startswith(OSWORLD_PYAUTOGUI_PREFIX):
        return None
    code = text[len(OSWORLD_PYAUTOGUI_PREFIX) :]
    if not code.strip() or code.strip() in PYAUTOGUI_SPECIAL:  # osfleet reads those as WAIT/DONE/FAIL: not code
        return None
    return code


CHROME_PROGRAMS = frozenset({"google-chrome", "google-chrome-stable", "chromium", "chrome"})


def launches_chrome(command: str | list[str]) -> bool:
    """Whether a launch starts the browser (its program's name, a path or not), the one launch that here hands
    its command line to a browser already running instead of starting one."""
    try:
        argv = shlex.split(command) if isinstance(command, str) else command
    except ValueError:
        return False
    return bool(argv) and posixpath.basename(str(argv[0])) in CHROME_PROGRAMS


def launch(command: str | list[str], shell: bool) -> str:
    """Start ``command`` and return at once (OSWorld's ``Popen``): in a session of its own, its output dropped.
    Without a shell, a program that is not there fails now (exit 127), as ``Popen`` raises for it."""
    line = command_line(command, shell)
    detached = f"setsid -f sh -c {shlex.quote(line)} >/dev/null 2>&1 </dev/null"
    if shell:
        return detached
    argv = shlex.split(command) if isinstance(command, str) else command
    if not argv:
        return "echo 'nothing to launch: the command is empty' >&2; exit 127"
    program = shlex.quote(argv[0])
    return f"command -v -- {program} >/dev/null 2>&1 || {{ echo no such program: {program} >&2; exit 127; }}; " + (
        detached
    )


def _from_temp_file(content: str, suffix: str, run: str, before: str = "") -> str:
    """Write ``content`` to a new file under /tmp (as OSWorld does), ``run`` it (``"$f"`` names it), remove it,
    and exit with its status."""
    return (
        f"{before}f=$(mktemp --suffix={suffix} /tmp/osworld_XXXXXXXX) || exit 125; "
        f'printf %s {shlex.quote(content)} > "$f"; {run}; rc=$?; rm -f -- "$f"; exit $rc'
    )


def run_python(code: str) -> str:
    """OSWorld's ``/run_python``: the code as a file, run by the system's python3; stdout and stderr apart."""
    return _from_temp_file(code, ".py", '/usr/bin/python3 "$f"')


def run_bash_script(script: str, working_dir: str | None) -> str:
    """OSWorld's ``/run_bash_script``: the script as a file (a ``#!/bin/bash`` line and a blank one put first when
    it has none, as OSWorld does, so bash's line numbers match), run by bash in ``working_dir``, stderr merged into
    stdout. A working folder that is not there writes ``NO_WORKING_DIR`` to the command's own stderr."""
    if BASH_SHEBANG not in script:
        script = f"{BASH_SHEBANG}\n\n{script}"
    before, run = "", '/bin/bash "$f" 2>&1'
    if working_dir is not None:
        wd = shlex.quote(working_dir)
        before = f"[ -e {wd} ] || {{ echo {NO_WORKING_DIR} >&2; exit 1; }}; "
        run = f'(cd -- {wd} && /bin/bash "$f" 2>&1)'
    return _from_temp_file(script, ".sh", run, before)


def wmctrl(verb: str, window_name: str, strict: bool, by_class: bool) -> str:
    """``wmctrl -a`` (activate) or ``-c`` (close) by title substring, exact title (``strict``) or class, as
    OSWorld calls it (flags joined into one argument); wmctrl's status is not the endpoint's (OSWorld ignores it)."""
    flags = "-" + ("x" if by_class else "") + ("F" if strict else "") + verb
    return shlex.join(["wmctrl", flags, window_name])


def change_wallpaper(path: str) -> str:
    """gsettings' picture-uri set to the file (OSWorld: ``file://`` and the path as it is); a path that is not
    there writes ``NO_SUCH_PATH`` to the command's own stderr."""
    p = shlex.quote(path)
    uri = shlex.quote(f"file://{path}")
    check = f"[ -e {p} ] || {{ echo {NO_SUCH_PATH} >&2; exit 1; }}"
    return f"{check}; gsettings set org.gnome.desktop.background picture-uri {uri}"


WALLPAPER = "gsettings get org.gnome.desktop.background picture-uri"
DESKTOP = 'test -d "$HOME/Desktop"'
PLATFORM = "uname -s"
CURSOR = "xdotool getmouselocation --shell"

# The geometry of the first managed window (``_NET_CLIENT_LIST``, in its order) whose WM_CLASS instance or class
# equals the name, ignoring case, as OSWorld's server finds it with python-xlib; prints {"width", "height"}, or
# nothing when there is none. Run by the system's python3, whose python3-xlib pyautogui needs anyway.
WINDOW_SIZE_PY = """
import json, sys
from Xlib import X, display, error
want = sys.argv[1].lower()
d = display.Display()
root = d.screen().root
listed = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), X.AnyPropertyType)
for wid in (listed.value if listed is not None else []):
    try:
        w = d.create_resource_object("window", wid)
        names = w.get_wm_class()
        if names and want in [n.lower() for n in names]:
            g = w.get_geometry()
            print(json.dumps({"width": g.width, "height": g.height}))
            break
    except error.XError:
        continue
"""


def window_size(app_class_name: str) -> str:
    return shlex.join(["/usr/bin/python3", "-c", WINDOW_SIZE_PY, app_class_name])


def open_file(path: str, is_program: bool) -> str:
    """Open a file with ``xdg-open`` or start a program, detached (OSWorld's ``/setup/open_file``)."""
    argv = [path] if is_program else ["xdg-open", path]
    return f"setsid -f {shlex.join(argv)} >/dev/null 2>&1 </dev/null"


def path_kind(path: str, program: str) -> str:
    """Prints ``file`` when ``path`` exists, ``program`` when ``program`` is a command on the PATH, else nothing."""
    p, q = shlex.quote(path), shlex.quote(program)
    return f"if [ -e {p} ]; then echo file; elif command -v -- {q} >/dev/null 2>&1; then echo program; fi"


def wait_window(titles: Sequence[str], seconds: float) -> str:
    """Wait up to ``seconds`` for a window whose title holds one of ``titles`` (``wmctrl -l``), then activate
    it; exit 0 when it did, 1 when none showed. Polled by the clock, once a second, as OSWorld polls."""
    greps = " || ".join(f'printf %s "$line" | grep -qF -- {shlex.quote(t)}' for t in titles)
    return (
        f"end=$(($(date +%s) + {max(1, int(seconds))})); while [ $(date +%s) -lt $end ]; do "
        "wmctrl -l 2>/dev/null | { while IFS= read -r line; do "
        f'if {greps}; then wmctrl -i -a "${{line%% *}}" && exit 0; fi; done; exit 1; }} && exit 0; '
        "sleep 1; done; exit 1"
    )


def verify(window: str | None, command: str | None, seconds: float, interval: float) -> str:
    """OSWorld's verification of ``/setup/execute_with_verification``: until ``seconds`` have passed, every
    ``interval``, a window whose ``wmctrl -l`` line holds ``window`` (ignoring case) and/or ``command`` (through
    ``sh``, 5 s at most) succeeding; exit 0 when they did, 1 when time ran out."""
    checks = []
    if window is not None:
        checks.append(f"wmctrl -l 2>/dev/null | grep -qiF -- {shlex.quote(window)}")
    if command is not None:
        checks.append(f"timeout 5 sh -c {shlex.quote(command)} >/dev/null 2>&1")
    test = " && ".join(checks) or "true"
    return (
        f"end=$(($(date +%s) + {max(0, int(seconds))})); while :; do if {test}; then exit 0; fi; "
        f"[ $(date +%s) -ge $end ] && exit 1; sleep {max(0.1, interval):g}; done"
    )
