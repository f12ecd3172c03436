"""Mouse and keyboard at the hypervisor: QEMU ``input-send-event`` on the virtio tablet and PS/2 keyboard.

The tablet is absolute: QEMU scales 0..32767 over the screen, so a pixel maps exactly whatever the
guest's pointer acceleration. Its buttons are left, right, middle, back and forward (``side`` and ``extra``:
X's buttons 8 and 9) and the vertical wheel; the horizontal wheel goes through the guest's X server, since QEMU
7.2's tablet has none (``Input._sideways``). Text is typed as key presses of the guest's US keyboard; a
character it has no key for is typed through a spare key the guest's X server maps to it for the while
(``unicode_keys``). Keys held during a pointer action (``keys``: modifiers) go down before it and up after it,
whatever happens in between.

Where the pointer is, is known without asking the guest once osfleet has put it somewhere (each domain's
``keyboard_flow.KeyboardFlow.pointer``); a new domain (a reset, a fork's child) or the agent's own code (a shell
or pyautogui action may move it) makes it unknown, and then the guest's X server is asked.
"""

from __future__ import annotations

import contextlib
import re
import string
import time
from collections.abc import Callable, Iterator
from typing import Any

from osfleet.errors import OsfleetError
from osfleet.protocol.keys import KEY_NAMES, PLAIN, PYAUTOGUI_KEYS, SHIFTED, X_KEY_NAMES, X_SHIFTED_NAMES
from osfleet.replicas import keyboard_flow, unicode_keys
from osfleet.vm.virt import Virt

ABS_MAX = 32767
KEY_GAP_SECONDS = 0.008
CLICK_GAP_SECONDS = 0.05
DRAG_STEP_SECONDS = 0.01  # between the points of a drag that has no duration of its own
DRAG_STEPS = 8  # points a straight drag moves through
ASK_POINTER_SECONDS = 20.0  # the guest's X server telling where the pointer is (a guest command under TCG)
SIDEWAYS_SECONDS = 20.0  # the guest's X server scrolling sideways (``Input._sideways``)
SCROLL_LEFT, SCROLL_RIGHT = 6, 7  # X's buttons of the horizontal wheel

# osfleet's button names -> QEMU's (back and forward are the tablet's side and extra buttons: X's 8 and 9)
BUTTONS = {"left": "left", "right": "right", "middle": "middle", "back": "side", "forward": "extra"}
_MOUSE_LOCATION = re.compile(r"\AX=(\d{1,5})\nY=(\d{1,5})\n")

DesktopCommand = Callable[[str, float], dict[str, Any]]
"""Runs a command in the guest as the desktop user on its display (``actions.shell``): its exit code and output."""


class InputError(OsfleetError):
    """An input action cannot be expressed as key or pointer events (unknown key, bad coordinates)."""


def key_for_char(ch: str) -> tuple[str, bool]:
    """(qcode, needs shift) for one character of text the US keyboard has a key for."""
    if ch in string.ascii_lowercase or ch in string.digits:
        return ch, False
    if ch in string.ascii_uppercase:
        return ch.lower(), True
    if ch in PLAIN:
        return PLAIN[ch], False
    if ch in SHIFTED:
        return SHIFTED[ch], True
    raise InputError(f"cannot type {ch!r}: no key for it on the guest's US keyboard")


def check_text(text: str) -> None:
    """Refuse a text no key can type (``unicode_keys.untypable``) before any of it is typed."""
    reason = unicode_keys.untypable(text)
    if reason is not None:
        raise InputError(reason)


def qcode(name: str) -> str:
    """The key named ``name`` (osfleet's, X's, a browser's or pyautogui's name; any case)."""
    lowered = name.strip().lower()
    key = KEY_NAMES.get(lowered) or X_KEY_NAMES.get(lowered) or PYAUTOGUI_KEYS.get(lowered)
    if key is None:
        raise InputError(f"unknown key {name!r}")
    return key


def combo_key(name: str) -> tuple[str, bool]:
    """(qcode, needs shift) for a key of a combination: a key's name, X's name of a shifted character ("plus"),
    or one character the US keyboard has ("A", "+"): shift goes down with it, as xdotool presses them."""
    lowered = name.strip().lower()
    if lowered in X_SHIFTED_NAMES:
        return key_for_char(X_SHIFTED_NAMES[lowered])
    try:
        return qcode(name), False
    except InputError:
        if len(name) == 1:
            return key_for_char(name)
        raise


def combo(names: list[str]) -> list[str]:
    """The qcodes to hold for ``names`` pressed together, shift first when one of them needs it."""
    keys = [combo_key(n) for n in names]
    codes = [code for code, _ in keys]
    if any(shift for _, shift in keys) and "shift" not in codes and "shift_r" not in codes:
        codes.insert(0, "shift")
    return list(dict.fromkeys(codes))  # a key named twice goes down once


def pyautogui_key(name: str) -> tuple[str, bool]:
    """(qcode, needs shift) for one of pyautogui's key names, or a single character as pyautogui presses it
    (``"A"`` is shift+a, ``"!"`` shift+1, ``"\\n"`` enter)."""
    if len(name) == 1:
        return key_for_char(name)
    key = PYAUTOGUI_KEYS.get(name.lower())
    if key is None:
        raise InputError(f"unknown key {name!r}: not a key of the guest's keyboard")
    return key, False


def check_point(x: int, y: int, size: tuple[int, int], what: str = "") -> None:
    """Refuse a point off the screen (never clamped: the agent's coordinates are wrong, it should know)."""
    w, h = size
    if not (0 <= x < w and 0 <= y < h):
        raise InputError(f"{what}coordinates ({x}, {y}) are off the {w}x{h} screen")


def _key(code: str, down: bool) -> dict[str, Any]:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": code}}}


def _btn(button: str, down: bool) -> dict[str, Any]:
    return {"type": "btn", "data": {"down": down, "button": button}}


def _button(name: str) -> str:
    if name not in BUTTONS:
        raise InputError(f"unknown mouse button {name!r} ({', '.join(BUTTONS)})")
    return BUTTONS[name]


class Input:
    """Input for one domain whose screen is ``size`` pixels; ``guest`` runs the commands the pointer's position
    and Unicode text need (without it, those raise ``InputError``)."""

    def __init__(self, virt: Virt, domain: str, size: tuple[int, int], guest: DesktopCommand | None = None) -> None:
        self.virt, self.domain, self.size, self.guest = virt, domain, size, guest
        self.keyboard = keyboard_flow.flow_for(domain, self._keyboard_irqs)

    def _keyboard_irqs(self) -> int | None:
        out = self.virt.qmp(self.domain, "human-monitor-command", {"command-line": "info irq"})
        return keyboard_flow.irq1_count(out if isinstance(out, str) else "")

    def _send(self, events: list[dict[str, Any]]) -> None:
        """Send input events; keys only once the guest's keyboard has room for them (``keyboard_flow``)."""
        nbytes = keyboard_flow.scancode_bytes(events)
        if nbytes:
            self.keyboard.settle_after_pointer()
            self.keyboard.before(nbytes)
        self.virt.qmp(self.domain, "input-send-event", {"events": events})
        if nbytes:
            self.keyboard.after(nbytes)
        if any(e["type"] in ("abs", "btn") for e in events):
            self.keyboard.pointer_sent()

    def _abs(self, x: int, y: int) -> list[dict[str, Any]]:
        check_point(x, y, self.size)
        w, h = self.size
        return [
            {"type": "abs", "data": {"axis": "x", "value": round(x * ABS_MAX / max(1, w - 1))}},
            {"type": "abs", "data": {"axis": "y", "value": round(y * ABS_MAX / max(1, h - 1))}},
        ]

    # --- the pointer --------------------------------------------------------------------------------------------
    def move(self, x: int, y: int) -> None:
        events = self._abs(x, y)
        self.keyboard.pointer = None  # unknown should the move fail half-way
        self._send(events)
        self.keyboard.pointer = (x, y)

    def position(self) -> tuple[int, int]:
        """Where the pointer is: where osfleet put it last, else as the guest's X server says."""
        known = self.keyboard.pointer
        if known is None:
            known = self.keyboard.pointer = self._ask_pointer()
        return known

    def forget_position(self) -> None:
        """Something besides osfleet's events may have moved the pointer (the agent's own code)."""
        self.keyboard.pointer = None

    def _ask_pointer(self) -> tuple[int, int]:
        if self.guest is None:
            raise InputError("where the pointer is cannot be known here (no guest commands)")
        out = self.guest("exec xdotool getmouselocation --shell", ASK_POINTER_SECONDS)
        m = _MOUSE_LOCATION.match(str(out.get("stdout") or "")[:200])
        if out.get("exit_code") != 0 or m is None:
            raise OsfleetError(f"the desktop did not tell where its pointer is (exit code {out.get('exit_code')})")
        x, y = int(m.group(1)), int(m.group(2))
        check_point(x, y, self.size, "the desktop's pointer ")
        return x, y

    def click(
        self, x: int | None, y: int | None, button: str = "left", count: int = 1, keys: list[str] | None = None
    ) -> None:
        """``count`` clicks of ``button`` at (x, y), or where the pointer is when x and y are None, with ``keys``
        held down."""
        code = _button(button)
        if x is not None and y is not None:
            check_point(x, y, self.size)
        with self.holding(keys or []):
            if x is not None and y is not None:
                self.move(x, y)
            for i in range(count):
                if i:
                    time.sleep(CLICK_GAP_SECONDS)
                self._send([_btn(code, True)])
                self._send([_btn(code, False)])

    def button(self, button: str, down: bool) -> None:
        """Press or release a mouse button where the pointer is (OSWorld's MOUSE_DOWN / MOUSE_UP)."""
        self._send([_btn(_button(button), down)])

    def click_here(self, button: str = "left", count: int = 1) -> None:
        """Click where the pointer is, without moving it."""
        self.click(None, None, button, count)

    def drag_to(self, x: int, y: int) -> None:
        """Press the left button where the pointer is, move to (x, y), release (pyautogui's ``dragTo``)."""
        self._abs(x, y)  # validate before pressing
        self._send([_btn("left", True)])
        try:
            time.sleep(CLICK_GAP_SECONDS)
            self.move(x, y)
            time.sleep(CLICK_GAP_SECONDS)
        finally:  # a failed move must not leave the guest's button held down for the next action
            self._send([_btn("left", False)])

    def drag_path(
        self, points: list[tuple[int, int]], seconds: float = 0.0, button: str = "left", keys: list[str] | None = None
    ) -> None:
        """Press ``button`` at the first point, move through the others, release at the last. With ``seconds``
        the movement is spread over that time (a move every ``DRAG_STEP_SECONDS`` at most), as a hand drags."""
        code = _button(button)
        for x, y in points:
            check_point(x, y, self.size)  # every point before the button goes down
        if len(points) == 2 and seconds <= 0:  # a straight drag: a few points between, as before
            (x1, y1), (x2, y2) = points
            points = [(x1, y1)] + [
                (round(x1 + (x2 - x1) * i / DRAG_STEPS), round(y1 + (y2 - y1) * i / DRAG_STEPS))
                for i in range(1, DRAG_STEPS + 1)
            ]
        with self.holding(keys or []):
            self.move(*points[0])
            self._send([_btn(code, True)])
            try:
                gap = seconds / (len(points) - 1) if seconds > 0 else DRAG_STEP_SECONDS
                deadline = time.monotonic()
                for x, y in points[1:]:
                    deadline += gap
                    time.sleep(max(0.0, deadline - time.monotonic()))
                    self.move(x, y)
            finally:  # a failed move must not leave the guest's button held down for the next action
                self._send([_btn(code, False)])

    def drag(self, x1: int, y1: int, x2: int, y2: int, steps: int = DRAG_STEPS) -> None:
        self.drag_path([(x1, y1), (x2, y2)])

    def wheel(self, clicks: int, horizontal: bool = False) -> None:
        """Turn the wheel where the pointer is: positive ``clicks`` scroll down (or right), negative up (or left)."""
        if horizontal:
            self._sideways(clicks)
            return
        button = "wheel-down" if clicks > 0 else "wheel-up"
        for _ in range(abs(clicks)):
            self._send([_btn(button, True)])
            self._send([_btn(button, False)])

    def _sideways(self, clicks: int) -> None:
        """Horizontal wheel clicks: X's buttons 6 (left) and 7 (right), pressed by the guest's X server (XTest, with
        xdotool, which every osfleet image has). QEMU 7.2's virtio tablet has no horizontal wheel: its wheel-left
        and wheel-right events are dropped before the guest (measured: X saw none), so they cannot go as QEMU
        events. Keys held around the scroll are the keyboard's, so X applies them to these buttons too."""
        if clicks == 0:
            return
        if self.guest is None:
            raise InputError("cannot scroll sideways here: it needs a guest command")
        self.keyboard.settle_after_pointer()  # X has the pointer where the tablet put it last
        button = SCROLL_RIGHT if clicks > 0 else SCROLL_LEFT
        out = self.guest(f"exec xdotool click --repeat {abs(clicks)} --delay 10 {button}", SIDEWAYS_SECONDS)
        if out.get("exit_code") != 0:
            reason = str(out.get("stderr") or "").strip()[-200:] or f"exit code {out.get('exit_code')}"
            raise OsfleetError(f"the desktop did not scroll sideways: {reason}")

    def scroll(
        self, x: int | None, y: int | None, clicks: int, clicks_x: int = 0, keys: list[str] | None = None
    ) -> None:
        """Turn the wheel at (x, y), or where the pointer is: positive ``clicks`` scroll down, negative up;
        positive ``clicks_x`` right, negative left; with ``keys`` held down."""
        if x is not None and y is not None:
            check_point(x, y, self.size)
        with self.holding(keys or []):
            if x is not None and y is not None:
                self.move(x, y)
            self.wheel(clicks)
            self.wheel(clicks_x, horizontal=True)

    # --- the keyboard -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def holding(self, names: list[str]) -> Iterator[None]:
        """``names`` held down (in order) for the block, released (in reverse) however it ends."""
        if not names:
            yield
            return
        codes = combo(names)
        self._send([_key(c, True) for c in codes])
        try:
            # X reads the keyboard and the tablet in its own order: the pointer events wait until the guest has
            # the keys, so a click is never seen before the modifier it goes with.
            self.keyboard.drain()
            yield
        finally:
            self._send([_key(c, False) for c in reversed(codes)])

    def key(self, name: str, down: bool) -> None:
        """Press (``down``) or release one key by pyautogui's name. A character that needs shift is pressed
        with shift held only around the key, as pyautogui's ``keyDown`` does on X."""
        code, shift = pyautogui_key(name)
        events = [_key(code, down)]
        if shift and down:
            events = [_key("shift", True), *events, _key("shift", False)]
        self._send(events)

    def key_by_name(self, name: str, down: bool) -> None:
        """Press or release one key by any of its names (``qcode``), or a character the US keyboard has
        (shift around it, as ``key``)."""
        code, shift = combo_key(name)
        events = [_key(code, down)]
        if shift and down:
            events = [_key("shift", True), *events, _key("shift", False)]
        self._send(events)

    def hold(self, names: list[str], seconds: float) -> None:
        """Hold ``names`` down together for ``seconds``."""
        with self.holding(names):
            self.keyboard.drain()  # the hold starts once the guest has the keys
            time.sleep(seconds)

    def press(self, names: list[str]) -> None:
        """Press and release each key by pyautogui's name, in turn (``pyautogui.press``)."""
        for name in names:
            code, shift = pyautogui_key(name)
            events = [_key(code, True), _key(code, False)]
            if shift:
                events = [_key("shift", True), *events, _key("shift", False)]
            self._send(events)
            time.sleep(KEY_GAP_SECONDS)
        self.keyboard.drain()

    def key_combo(self, names: list[str]) -> None:
        """Press keys by pyautogui's names together and release them in reverse order (``pyautogui.hotkey``)."""
        if not names:
            raise InputError("a hotkey needs at least one key")
        codes = [pyautogui_key(n)[0] for n in names]
        self._send([_key(c, True) for c in codes])
        self._send([_key(c, False) for c in reversed(codes)])

    def type_text(self, text: str) -> None:
        """Type ``text``: the US keyboard's characters as its keys, any other through a spare key remapped to it
        (``unicode_keys``). The whole text is checked before any of it is typed."""
        check_text(text)
        plan = unicode_keys.plan(text, self.keyboard.spare)
        if plan.remaps and self.guest is None:
            raise InputError(f"cannot type {plan.first_unicode!r} here: it needs a guest command")
        typed = 0
        for part in plan.parts:
            if part.remap:
                self._remap(part.remap)
            for ch in part.text:
                spare = None if unicode_keys.on_keyboard(ch) else self.keyboard.spare_code(ch)
                if spare is not None:
                    events = [_key(spare, True), _key(spare, False)]
                else:
                    code, shift = key_for_char(ch)
                    events = [_key(code, True), _key(code, False)]
                    if shift:
                        events = [_key("shift", True), *events, _key("shift", False)]
                try:
                    self._send(events)
                except keyboard_flow.KeyboardStalledError as exc:
                    raise InputError(f"typed {typed} of {len(text)} characters: {exc}") from None
                if spare is not None:
                    self.keyboard.spare_used(spare)
                typed += 1
                time.sleep(KEY_GAP_SECONDS)
        self.keyboard.drain()  # every key sent; returns once the guest has read them (or stopped reading)

    def _remap(self, remap: dict[str, str]) -> None:
        """Map spare keys (qcode -> character) in the guest's X server, once the keys being changed were last
        typed long enough ago that the window they went to has read them with their old meaning."""
        assert self.guest is not None
        self.keyboard.drain()
        self.keyboard.settle_spares(list(remap))
        out = self.guest(unicode_keys.remap_command(remap), unicode_keys.REMAP_SECONDS)
        if out.get("exit_code") != 0:
            for code in remap:
                self.keyboard.spare.pop(code, None)  # unknown now
            reason = str(out.get("stderr") or "").strip().splitlines()[-1:] or [f"exit code {out.get('exit_code')}"]
            raise OsfleetError(
                f"the desktop's X server did not take a key for {''.join(remap.values())!r}: {reason[0][:200]}"
            )
        self.keyboard.spare.update(remap)

    def hotkey(self, keys: list[str]) -> None:
        """Press ``keys`` together (e.g. ["ctrl", "s"]) and release them in reverse order; a key that is a
        shifted character ("plus", "A") brings shift with it."""
        if not keys:
            raise InputError("a hotkey needs at least one key")
        codes = combo(keys)
        self._send([_key(c, True) for c in codes])
        self._send([_key(c, False) for c in reversed(codes)])
