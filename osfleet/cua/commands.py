"""Cua's computer-server commands (``{"command": NAME, "params": {...}}``), answered for one leased desktop.

``cua-computer`` (and ``cua-agent`` through it) sends each command to ``POST /cmd`` and reads one JSON answer with
``success``. Here each becomes osfleet actions or an observation of the lease, answered in the shape Cua's own
server answers (``image_data`` for a screenshot, ``size``, ``position``, ``stdout``/``stderr``/``return_code``, ...):

- pointer and keys: ``left_click``, ``right_click``, ``double_click``, ``move_cursor``, ``mouse_down``,
  ``mouse_up``, ``drag_to`` (from where the pointer is), ``drag`` (a path), ``scroll`` (x right, y up, as pynput),
  ``scroll_down``, ``scroll_up``, ``type_text`` (any Unicode), ``press_key``, ``hotkey``, ``key_down``, ``key_up``;
- the screen: ``screenshot`` (PNG), ``get_screen_size``, ``get_cursor_position``;
- the desktop user's files and shell (never root): ``run_command``, ``file_exists``, ``directory_exists``,
  ``list_dir``, ``read_text``, ``write_text``, ``read_bytes``, ``write_bytes``, ``get_file_size``, ``delete_file``,
  ``create_dir``, ``delete_dir``; contents through the fleet's files endpoint, the rest as shell commands
  (``osfleet.e2b.guest_files``, shared with the E2B server);
- the clipboard: ``set_clipboard`` keeps the text here and ``copy_to_clipboard`` answers it; the paste chord that
  cua-computer sends after it to type non-ASCII text (``command+v``, ``ctrl+v``) types that text with osfleet's
  own Unicode input (the desktop has no clipboard tool to put it there).

A refused action (a point off the screen, an unknown key) or a failed command answers ``success: false`` with the
reason, as Cua's server does; ``get_accessibility_tree``, ``find_element`` and ``diorama_cmd`` are not served.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from osfleet import __version__
from osfleet.client import FleetError
from osfleet.client.computer_use import run, screen_size, wheel
from osfleet.client.fleet import AsyncSession
from osfleet.e2b import guest_files
from osfleet.e2b.guest_files import GuestFileError

PROTOCOL = 1  # Cua's computer-server protocol version, as its ``version`` command answers
COMMAND_TIMEOUT = 60.0  # seconds a ``run_command`` may run in the guest
MAX_PATH_POINTS = 200  # points of a ``drag`` path
PASTE_CHORDS = ({"command", "v"}, {"cmd", "v"}, {"ctrl", "v"}, {"control", "v"}, {"shift", "insert"})
BUTTONS = ("left", "right", "middle")
Answer = dict[str, Any]


class CommandError(Exception):
    """A command refused as given: the reason goes back with ``success: false``."""


@dataclass
class Desk:
    """The leased desktop the commands act on, and what this server keeps for it (the clipboard, the size)."""

    session: AsyncSession
    clipboard: str | None = None
    size: tuple[int, int] | None = None

    async def screen(self) -> tuple[int, int]:
        if self.size is None:
            self.size = await screen_size(self.session)
        return self.size


def _int(params: dict[str, Any], name: str, default: int | None = None) -> int:
    value = params.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CommandError(f"{name} is a whole number, not {value!r}")
    return value


def _point(params: dict[str, Any]) -> dict[str, int]:
    """``x`` and ``y`` when given (both), else nothing: where the pointer is."""
    if params.get("x") is None and params.get("y") is None:
        return {}
    return {"x": _int(params, "x"), "y": _int(params, "y")}


def _text(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str):
        raise CommandError(f"{name} is text, not {type(value).__name__}")
    return value


def _button(params: dict[str, Any]) -> str:
    button = params.get("button", "left")
    if button not in BUTTONS:
        raise CommandError(f"button is one of {', '.join(BUTTONS)}, not {button!r}")
    return str(button)


def _keys(params: dict[str, Any]) -> list[str]:
    keys = params.get("keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise CommandError("keys is a list of key names")
    return [str(k) for k in keys]


async def _act(desk: Desk, *actions: dict[str, Any]) -> Answer:
    await run(desk.session, list(actions))
    return {}


async def left_click(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "click", **_point(p)})


async def right_click(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "click", "button": "right", **_point(p)})


async def double_click(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "click", "count": 2, **_point(p)})


async def move_cursor(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "move", "x": _int(p, "x"), "y": _int(p, "y")})


async def mouse_down(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "mouse_down", "button": _button(p), **_point(p)})


async def mouse_up(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "mouse_up", "button": _button(p), **_point(p)})


def _seconds(p: dict[str, Any]) -> float:
    value = p.get("duration", 0.5)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 30:
        raise CommandError(f"duration is 0 to 30 seconds, not {value!r}")
    return float(value)


async def drag_to(desk: Desk, p: dict[str, Any]) -> Answer:
    x, y = await desk.session.cursor_position()
    path = [[x, y], [_int(p, "x"), _int(p, "y")]]
    return await _act(desk, {"type": "drag", "path": path, "button": _button(p), "seconds": _seconds(p)})


async def drag(desk: Desk, p: dict[str, Any]) -> Answer:
    points = p.get("path")
    if not isinstance(points, list) or not 2 <= len(points) <= MAX_PATH_POINTS:
        raise CommandError(f"path is 2 to {MAX_PATH_POINTS} points [x, y]")
    path = []
    for point in points:
        if not isinstance(point, list | tuple) or len(point) != 2:
            raise CommandError(f"a point of the path is [x, y], not {point!r}")
        path.append([_int({"x": point[0]}, "x"), _int({"y": point[1]}, "y")])
    return await _act(desk, {"type": "drag", "path": path, "button": _button(p), "seconds": _seconds(p)})


async def scroll(desk: Desk, p: dict[str, Any]) -> Answer:
    """pynput's scroll, as Cua's server calls it: ``x`` clicks right, ``y`` clicks up."""
    right, up = _int(p, "x", 0), _int(p, "y", 0)
    turns = [{"type": "scroll", "clicks": n} for n in wheel(-up)] if up else []
    turns += [{"type": "scroll", "clicks_x": n} for n in wheel(right)] if right else []
    return await _act(desk, *turns) if turns else {}


async def scroll_down(desk: Desk, p: dict[str, Any]) -> Answer:
    clicks = _int(p, "clicks", 1)
    return await _act(desk, *({"type": "scroll", "clicks": n} for n in wheel(clicks))) if clicks else {}


async def scroll_up(desk: Desk, p: dict[str, Any]) -> Answer:
    clicks = _int(p, "clicks", 1)
    return await _act(desk, *({"type": "scroll", "clicks": n} for n in wheel(-clicks))) if clicks else {}


async def type_text(desk: Desk, p: dict[str, Any]) -> Answer:
    text = _text(p, "text")
    return await _act(desk, {"type": "type", "text": text}) if text else {}


async def press_key(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _chord(desk, [_text(p, "key")])


async def hotkey(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _chord(desk, _keys(p))


async def _chord(desk: Desk, keys: list[str]) -> Answer:
    if desk.clipboard is not None and {k.lower() for k in keys} in PASTE_CHORDS:
        return await _act(desk, {"type": "type", "text": desk.clipboard}) if desk.clipboard else {}
    return await _act(desk, {"type": "hotkey", "keys": keys})


async def key_down(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "key_down", "key": _text(p, "key")})


async def key_up(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _act(desk, {"type": "key_up", "key": _text(p, "key")})


async def screenshot(desk: Desk, p: dict[str, Any]) -> Answer:
    shot = await desk.session.observe(format="png")
    desk.size = (shot.width, shot.height)
    return {"image_data": base64.b64encode(shot.data).decode()}


async def get_screen_size(desk: Desk, p: dict[str, Any]) -> Answer:
    w, h = await desk.screen()
    return {"size": {"width": w, "height": h}}


async def get_cursor_position(desk: Desk, p: dict[str, Any]) -> Answer:
    x, y = await desk.session.cursor_position()
    return {"position": {"x": x, "y": y}}


async def set_clipboard(desk: Desk, p: dict[str, Any]) -> Answer:
    desk.clipboard = _text(p, "text")
    return {}


async def copy_to_clipboard(desk: Desk, p: dict[str, Any]) -> Answer:
    if desk.clipboard is None:
        raise CommandError("the clipboard is empty (only text set with set_clipboard is kept)")
    return {"content": desk.clipboard}


async def _shell(desk: Desk, command: str, timeout: float = COMMAND_TIMEOUT) -> tuple[int, str, str]:
    result = await desk.session.step({"type": "cli_command", "command": command, "timeout": timeout}, observe=False)
    (outcome,) = result.results
    if not outcome.ok:
        raise CommandError(f"the command did not finish: {outcome.error}")
    return outcome.exit_code or 0, outcome.stdout or "", outcome.stderr or ""


async def run_command(desk: Desk, p: dict[str, Any]) -> Answer:
    code, out, err = await _shell(desk, _text(p, "command"))
    return {"stdout": out, "stderr": err, "return_code": code}


def _path(p: dict[str, Any]) -> str:
    try:
        return guest_files.resolve(_text(p, "path"))
    except GuestFileError as exc:
        raise CommandError(str(exc)) from None


async def file_exists(desk: Desk, p: dict[str, Any]) -> Answer:
    code, _, _ = await _shell(desk, f"test -f {shlex.quote(_path(p))}")
    return {"exists": code == 0}


async def directory_exists(desk: Desk, p: dict[str, Any]) -> Answer:
    code, _, _ = await _shell(desk, f"test -d {shlex.quote(_path(p))}")
    return {"exists": code == 0}


async def list_dir(desk: Desk, p: dict[str, Any]) -> Answer:
    found = await guest_files.list_dir(desk.session, _path(p), 1)
    return {"files": [e.name for e in found if e.type in ("file", "dir")]}


async def get_file_size(desk: Desk, p: dict[str, Any]) -> Answer:
    entry = await guest_files.stat(desk.session, _path(p))
    return {"size": entry.size}


async def read_bytes(desk: Desk, p: dict[str, Any]) -> Answer:
    data = await desk.session.download(_path(p))
    offset = _int(p, "offset", 0)
    length = p.get("length")
    end = None if length is None else offset + _int(p, "length")
    return {"content_b64": base64.b64encode(data[offset:end]).decode()}


async def read_text(desk: Desk, p: dict[str, Any]) -> Answer:
    data = await desk.session.download(_path(p))
    return {"content": data.decode("utf-8", errors="replace")}


async def _write(desk: Desk, path: str, data: bytes, append: bool) -> Answer:
    if append:
        try:
            data = await desk.session.download(path) + data
        except FleetError as exc:
            if exc.status != 404:
                raise
    await desk.session.upload(path, data)
    return {}


async def write_bytes(desk: Desk, p: dict[str, Any]) -> Answer:
    try:
        data = base64.b64decode(_text(p, "content_b64"), validate=True)
    except ValueError:
        raise CommandError("content_b64 is not base64") from None
    return await _write(desk, _path(p), data, p.get("append") is True)


async def write_text(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _write(desk, _path(p), _text(p, "content").encode(), p.get("append") is True)


async def _must(desk: Desk, command: str, otherwise: str) -> Answer:
    """Run ``command`` as the desktop user; a failure is the command's error (what it printed, else ``otherwise``)."""
    code, _, err = await _shell(desk, command)
    if code != 0:
        raise CommandError(err.strip() or otherwise)
    return {}


async def delete_file(desk: Desk, p: dict[str, Any]) -> Answer:
    path = shlex.quote(_path(p))
    return await _must(desk, f"test -f {path} && rm -f -- {path}", f"{_path(p)} is not a file")


async def create_dir(desk: Desk, p: dict[str, Any]) -> Answer:
    return await _must(desk, f"mkdir -p -- {shlex.quote(_path(p))}", f"{_path(p)} could not be made")


async def delete_dir(desk: Desk, p: dict[str, Any]) -> Answer:
    path = shlex.quote(_path(p))
    return await _must(desk, f"test -d {path} && rm -rf -- {path}", f"{_path(p)} is not a folder")


async def version(desk: Desk, p: dict[str, Any]) -> Answer:
    return {"protocol": PROTOCOL, "package": f"osfleet-{__version__}"}


Handler = Callable[[Desk, dict[str, Any]], Awaitable[Answer]]
HANDLERS: dict[str, Handler] = {
    f.__name__: f
    for f in (
        version,
        left_click,
        right_click,
        double_click,
        move_cursor,
        mouse_down,
        mouse_up,
        drag_to,
        drag,
        scroll,
        scroll_down,
        scroll_up,
        type_text,
        press_key,
        hotkey,
        key_down,
        key_up,
        screenshot,
        get_screen_size,
        get_cursor_position,
        set_clipboard,
        copy_to_clipboard,
        run_command,
        file_exists,
        directory_exists,
        list_dir,
        get_file_size,
        read_bytes,
        read_text,
        write_bytes,
        write_text,
        delete_file,
        create_dir,
        delete_dir,
    )
}
NOT_SERVED = ("get_accessibility_tree", "find_element", "diorama_cmd")


async def answer(desk: Desk, command: object, params: object) -> Answer:
    """One command's answer, always a dict with ``success``: a refusal or failure says why."""
    if not isinstance(command, str) or not command:
        return {"success": False, "error": "command is the name of a command"}
    if command in NOT_SERVED:
        return {"success": False, "error": f"{command} is not served by osfleet cua serve"}
    handler = HANDLERS.get(command)
    if handler is None:
        return {"success": False, "error": f"Unknown command: {command[:80]}"}
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return {"success": False, "error": "params is a JSON object"}
    try:
        return {"success": True, **await handler(desk, params)}
    except CommandError as exc:
        return {"success": False, "error": str(exc)}
    except GuestFileError as exc:
        return {"success": False, "error": str(exc)}
    except FleetError as exc:
        return {"success": False, "error": str(exc)}
