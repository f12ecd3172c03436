"""e2b-desktop's shell lines, answered with the fleet's own capture and input instead of being run in the guest.

``e2b_desktop.Sandbox`` does everything as shell lines through ``commands.run``: it starts Xvfb and XFCE (then
checks them with ``xdpyinfo`` and ``pgrep``), takes screenshots with ``scrot --pointer /tmp/screenshot-<uuid>.png``
and reads the file back, moves and clicks with ``xdotool``, types with ``xdotool type --delay D -- TEXT``, asks
``xrandr`` for the screen's size. An osfleet desktop is already running, and its input and screen belong to the
hypervisor (QEMU's input events, the framebuffer), so those lines become osfleet actions and observations:

- ``scrot [--pointer] PATH``: the screen as PNG, kept here under PATH (``DesktopState``): ``files.read`` and
  ``files.remove`` of that path are answered from it; the guest's disk is not touched.
- ``xdotool mousemove [--sync] X Y``, ``click [--repeat N] [--delay D] B``, ``mousedown B``, ``mouseup B``,
  ``getmouselocation``, ``type [--delay D] [--] TEXT``, ``key [--delay D] K[+K...]...``, ``keydown K``, ``keyup K``:
  the actions of the same meaning (buttons 1-3 and 8-9 are clicks, 4-7 the wheel both ways).
- ``Xvfb :0 ...`` and ``startxfce4``: the desktop runs already; they answer as processes that run until killed.
  ``xdpyinfo -display :0`` and e2b-desktop's ``pgrep`` check of XFCE answer that it is up; ``xrandr`` its size.
- ``sleep S``: a process here that ends with status 0 after S seconds, or by its signal.
- the live view (``stream.start()``): ``x11vnc -storepasswd PASSWORD ~/.vnc/passwd``, ``x11vnc -bg -display :0 ...
  -usepw``, ``novnc_proxy --listen PORT`` (a process until killed), ``netstat`` for its port, ``pgrep -x x11vnc`` and
  ``pkill x11vnc`` keep the view's state here; ``live_view`` serves it (the screen, view-only) at the URL
  e2b-desktop gives, for the password. Without one (``-nopw``) x11vnc is refused with the reason.

A line is recognised only when it is exactly what ``shlex.join`` makes of its words (so nothing in it is expanded
or redirected by a shell) and its words are one of the forms above; anything else, ``xdotool`` included (window
queries, say), runs in the guest as the desktop user like any command. An action the desktop refuses (a point off
the screen, an unknown key) answers exit status 1 with the reason on stderr, which the SDK raises.
"""

from __future__ import annotations

import re
import shlex
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from osfleet.client import FleetError, InvalidRequestError
from osfleet.client.computer_use import run, screen_size, wheel
from osfleet.client.fleet import AsyncSession

DISPLAY = ":0"  # the desktop's display, as e2b-desktop's default
MAX_SHOTS = 16  # screenshots kept for files.read at once (e2b-desktop reads and removes each at once)
MAX_SLEEP = 600.0  # seconds a ``sleep`` line may ask for
MAX_REPEAT = 100  # clicks one ``xdotool click --repeat`` may ask for
XFCE_CHECK = "pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null"
LIVE_VIEW = "osfleet e2b serve: this x11vnc line is not one of e2b-desktop's stream.start() (docs: how-to/e2b.md)"
LIVE_VIEW_NEEDS_AUTH = (
    "osfleet e2b serve: the live view is served only with a password: stream.start(require_auth=True), then "
    "stream.get_url(auth_key=stream.get_auth_key()) (docs: how-to/e2b.md, the domain mode)"
)
KEY_WORD = re.compile(r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$")
INT = re.compile(r"^-?\d{1,6}$")
CLICKS = {"1": "left", "2": "middle", "3": "right", "8": "back", "9": "forward"}
WHEEL = {"4": ("clicks", -1), "5": ("clicks", 1), "6": ("clicks_x", -1), "7": ("clicks_x", 1)}
Kind = Literal[
    "step",
    "screenshot",
    "cursor",
    "xrandr",
    "xdpyinfo",
    "sleep",
    "running",
    "status",
    "view_password",
    "view_start",
    "view_proxy",
    "view_port",
    "view_status",
    "view_stop",
]
NOVNC = re.compile(
    r"^cd /opt/noVNC/utils && \./novnc_proxy --vnc localhost:\d{1,5} --listen (\d{1,5}) --web /opt/noVNC "
    r"> /tmp/novnc\.log 2>&1$"
)
NETSTAT = re.compile(r'^netstat -tuln \| grep ":(\d{1,5}) "$')
PASSWORD = re.compile(r"^[A-Za-z0-9]{8,64}$")


@dataclass(frozen=True)
class Line:
    """A recognised line: what to do for it (``kind``) and with what."""

    kind: Kind
    actions: tuple[dict[str, Any], ...] = ()
    path: str = ""
    seconds: float = 0.0
    exit_code: int = 0
    reason: str = ""
    port: int = 0


@dataclass(frozen=True)
class Outcome:
    """What a recognised line answers, as a process would: its exit status and output. ``running``: it goes on
    until killed (Xvfb, startxfce4: the desktop they would start runs already), or for ``lasts`` seconds at most
    (``sleep S``, which like the real one starts at once, may run in the background and dies by a signal)."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    running: bool = False
    lasts: float | None = None


@dataclass
class DesktopState:
    """What e2b-desktop's lines leave here for a sandbox: the screenshots taken for ``scrot`` lines, by path, until
    read and removed (the oldest go past ``MAX_SHOTS``); the screen's size once known; and its live view (the
    password ``x11vnc -storepasswd`` set, whether "x11vnc" runs, the port "noVNC" listens on: ``live_view``)."""

    files: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    size: tuple[int, int] | None = None
    view_password: str | None = None
    view_running: bool = False
    view_port: int | None = None

    def keep(self, path: str, data: bytes) -> None:
        self.files[path] = data
        self.files.move_to_end(path)
        while len(self.files) > MAX_SHOTS:
            self.files.popitem(last=False)

    async def screen(self, session: AsyncSession) -> tuple[int, int]:
        if self.size is None:
            self.size = await screen_size(session)
        return self.size


def recognise(command: str) -> Line | None:
    """The line as one of e2b-desktop's (``None``: not one; it runs in the guest)."""
    if command == XFCE_CHECK:
        return Line("status", exit_code=0)
    if command.split(maxsplit=1)[:1] == ["x11vnc"]:  # answered or refused whatever follows: nothing of it runs
        return _x11vnc(command.split())
    if novnc := NOVNC.match(command):
        return Line("view_proxy", port=int(novnc.group(1)))
    if netstat := NETSTAT.match(command):
        return Line("view_port", port=int(netstat.group(1)))
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or shlex.join(words) != command:
        return None
    match words:
        case ["scrot", path] | ["scrot", "--pointer", path] if _shot_path(path):
            return Line("screenshot", path=path)
        case ["xrandr"]:
            return Line("xrandr")
        case ["xdpyinfo"] | ["xdpyinfo", "-display", ":0"]:
            return Line("xdpyinfo")
        case ["Xvfb", display, *_] if display == DISPLAY:
            return Line("running")
        case ["startxfce4"]:
            return Line("running")
        case ["sleep", seconds] if re.match(r"^\d{1,4}(\.\d{1,6})?$", seconds) and float(seconds) <= MAX_SLEEP:
            return Line("sleep", seconds=float(seconds))
        case ["xdotool", *rest]:
            return _xdotool(rest)
        case ["pgrep", "-x", "x11vnc"]:
            return Line("view_status")
        case ["pkill", "x11vnc"]:
            return Line("view_stop")
    return None


def _x11vnc(words: list[str]) -> Line:
    """e2b-desktop's x11vnc lines: the password stored, then the server started on the display with it. A view
    without a password (``-nopw``) is refused: its URL would let anyone who learns it watch the desktop."""
    if len(words) == 4 and words[1] == "-storepasswd" and words[3] == "~/.vnc/passwd" and PASSWORD.match(words[2]):
        return Line("view_password", path=words[2])
    if words[1:2] == ["-bg"] and "-display" in words and words[words.index("-display") + 1 :][:1] == [DISPLAY]:
        if "-usepw" in words:
            return Line("view_start")
        return Line("status", exit_code=1, reason=LIVE_VIEW_NEEDS_AUTH)
    return Line("status", exit_code=1, reason=LIVE_VIEW)


def _shot_path(path: str) -> bool:
    return path.startswith("/tmp/") and path.endswith(".png") and ".." not in path.split("/") and len(path) < 256


def _options(words: list[str], allowed: tuple[str, ...]) -> tuple[dict[str, str], list[str]] | None:
    """xdotool's ``--name value`` options (those ``allowed``) before the arguments; None when one is not allowed."""
    given: dict[str, str] = {}
    while words and words[0].startswith("--") and words[0] != "--":
        name = words[0][2:]
        if name == "sync" and "sync" in allowed:
            given[name] = ""
            words = words[1:]
            continue
        if name not in allowed or len(words) < 2 or not INT.match(words[1]):
            return None
        given[name], words = words[1], words[2:]
    return given, words


def _xdotool(words: list[str]) -> Line | None:
    if not words:
        return None
    verb, rest = words[0], words[1:]
    if verb == "getmouselocation" and not rest:
        return Line("cursor")
    if verb == "mousemove":
        parsed = _options(rest, ("sync",))
        if parsed is None or len(parsed[1]) != 2 or not all(INT.match(w) for w in parsed[1]):
            return None
        x, y = (int(w) for w in parsed[1])
        return Line("step", ({"type": "move", "x": x, "y": y},))
    if verb == "click":
        parsed = _options(rest, ("repeat", "delay"))
        if parsed is None or len(parsed[1]) != 1:
            return None
        repeat = int(parsed[0].get("repeat", "1"))
        return _click(parsed[1][0], repeat) if 1 <= repeat <= MAX_REPEAT else None
    if verb in ("mousedown", "mouseup") and len(rest) == 1 and rest[0] in CLICKS:
        return Line("step", ({"type": "mouse_down" if verb == "mousedown" else "mouse_up", "button": CLICKS[rest[0]]},))
    if verb == "type":
        parsed = _options(rest, ("delay",))
        if parsed is None:
            return None
        text = parsed[1][1:] if parsed[1][:1] == ["--"] else parsed[1]
        if len(text) != 1:
            return None
        return Line("step", ({"type": "type", "text": text[0]},) if text[0] else ())
    if verb == "key":
        parsed = _options(rest, ("delay",))
        if parsed is None or not parsed[1] or not all(KEY_WORD.match(w) for w in parsed[1]):
            return None
        return Line("step", tuple({"type": "hotkey", "keys": w.split("+")} for w in parsed[1]))
    if verb in ("keydown", "keyup") and len(rest) == 1 and KEY_WORD.match(rest[0]) and "+" not in rest[0]:
        return Line("step", ({"type": "key_down" if verb == "keydown" else "key_up", "key": rest[0]},))
    return None


def _click(button: str, repeat: int) -> Line | None:
    if button in CLICKS:
        actions = []
        left = repeat
        while left > 0:  # a click action counts up to 3 (a triple click)
            actions.append({"type": "click", "button": CLICKS[button], "count": min(left, 3)})
            left -= 3
        return Line("step", tuple(actions))
    if button in WHEEL:
        axis, sign = WHEEL[button]
        return Line("step", tuple({"type": "scroll", axis: n} for n in wheel(sign * repeat)))
    return None


async def answer(line: Line, session: AsyncSession, shots: DesktopState) -> Outcome:
    """Do what ``line`` asks with the fleet and answer as the program would have. An action the desktop refuses
    answers status 1 with the reason; a failure of the lease or the fleet raises (``FleetError``)."""
    try:
        return await _answer(line, session, shots)
    except InvalidRequestError as exc:
        return Outcome(1, stderr=f"{exc}\n".encode())
    except FleetError as exc:
        if exc.kind == "action_failed":
            return Outcome(1, stderr=f"{exc}\n".encode())
        raise


async def _answer(line: Line, session: AsyncSession, shots: DesktopState) -> Outcome:
    match line.kind:
        case "step":
            if line.actions:
                await run(session, list(line.actions))
            return Outcome(0)
        case "screenshot":
            shot = await session.observe(format="png")
            shots.size = (shot.width, shot.height)
            shots.keep(line.path, shot.data)
            return Outcome(0)
        case "cursor":
            x, y = await session.cursor_position()
            return Outcome(0, f"x:{x} y:{y} screen:0 window:0\n".encode())
        case "xrandr":
            w, h = await shots.screen(session)
            text = f"Screen 0: minimum 1 x 1, current {w} x {h}, maximum {w} x {h}\nosfleet connected {w}x{h}+0+0\n"
            return Outcome(0, text.encode())
        case "xdpyinfo":
            w, h = await shots.screen(session)
            return Outcome(0, f"name of display:    {DISPLAY}\n  dimensions:    {w}x{h} pixels\n".encode())
        case "sleep":
            return Outcome(0, running=True, lasts=line.seconds)
        case "running":
            return Outcome(0, running=True)
        case "view_password":
            shots.view_password = line.path
            return Outcome(0)
        case "view_start":
            if shots.view_password is None:
                return Outcome(1, stderr=b"x11vnc -usepw: no password was stored (x11vnc -storepasswd)\n")
            shots.view_running = True
            return Outcome(0)
        case "view_proxy":
            if not shots.view_running:
                return Outcome(1, stderr=b"novnc_proxy: no VNC server runs (x11vnc)\n")
            shots.view_port = line.port
            return Outcome(0, running=True)
        case "view_port":
            if shots.view_port != line.port:
                return Outcome(1)
            return Outcome(
                0, f"tcp        0      0 0.0.0.0:{line.port}            0.0.0.0:*               LISTEN\n".encode()
            )
        case "view_status":
            return Outcome(0 if shots.view_running else 1, b"1\n" if shots.view_running else b"")
        case "view_stop":
            was = shots.view_running
            shots.view_running, shots.view_port = False, None
            return Outcome(0 if was else 1)
    return Outcome(line.exit_code, stderr=f"{line.reason}\n".encode() if line.reason else b"")
