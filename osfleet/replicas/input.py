"""Mouse and keyboard at the hypervisor: QEMU ``input-send-event`` on the virtio tablet and PS/2 keyboard.

The tablet is absolute: QEMU scales 0..32767 over the screen, so a pixel maps exactly whatever the
guest's pointer acceleration. Text is typed as key presses (US layout); a character that has no key
there is refused with an error naming it rather than typed wrongly.
"""

from __future__ import annotations

import string
import time
from typing import Any

from osfleet.errors import OsfleetError
from osfleet.protocol.keys import KEY_NAMES, PLAIN, PYAUTOGUI_KEYS, SHIFTED
from osfleet.replicas import keyboard_flow
from osfleet.vm.virt import Virt

ABS_MAX = 32767
KEY_GAP_SECONDS = 0.008
CLICK_GAP_SECONDS = 0.05

BUTTONS = {"left": "left", "right": "right", "middle": "middle"}


class InputError(OsfleetError):
    """An input action cannot be expressed as key or pointer events (unknown key, bad coordinates)."""


def key_for_char(ch: str) -> tuple[str, bool]:
    """(qcode, needs shift) for one character of text."""
    if ch in string.ascii_lowercase or ch in string.digits:
        return ch, False
    if ch in string.ascii_uppercase:
        return ch.lower(), True
    if ch in PLAIN:
        return PLAIN[ch], False
    if ch in SHIFTED:
        return SHIFTED[ch], True
    raise InputError(f"cannot type {ch!r}: no key for it on the guest's US keyboard")


def qcode(name: str) -> str:
    key = KEY_NAMES.get(name.strip().lower())
    if key is None:
        raise InputError(f"unknown key {name!r}")
    return key


def pyautogui_key(name: str) -> tuple[str, bool]:
    """(qcode, needs shift) for one of pyautogui's key names, or a single character as pyautogui presses it
    (``"A"`` is shift+a, ``"!"`` shift+1, ``"\\n"`` enter)."""
    if len(name) == 1:
        return key_for_char(name)
    key = PYAUTOGUI_KEYS.get(name.lower())
    if key is None:
        raise InputError(f"unknown key {name!r}: not a key of the guest's keyboard")
    return key, False


def _key(code: str, down: bool) -> dict[str, Any]:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": code}}}


def _btn(button: str, down: bool) -> dict[str, Any]:
    return {"type": "btn", "data": {"down": down, "button": button}}


class Input:
    """Input for one domain whose screen is ``size`` pixels."""

    def __init__(self, virt: Virt, domain: str, size: tuple[int, int]) -> None:
        self.virt, self.domain, self.size = virt, domain, size
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
        w, h = self.size
        if not (0 <= x < w and 0 <= y < h):
            raise InputError(f"coordinates ({x}, {y}) are off the {w}x{h} screen")
        return [
            {"type": "abs", "data": {"axis": "x", "value": round(x * ABS_MAX / max(1, w - 1))}},
            {"type": "abs", "data": {"axis": "y", "value": round(y * ABS_MAX / max(1, h - 1))}},
        ]

    def move(self, x: int, y: int) -> None:
        self._send(self._abs(x, y))

    def click(self, x: int, y: int, button: str = "left", count: int = 1) -> None:
        if button not in BUTTONS:
            raise InputError(f"unknown mouse button {button!r} (left, right, middle)")
        self.move(x, y)
        for i in range(count):
            if i:
                time.sleep(CLICK_GAP_SECONDS)
            self._send([_btn(BUTTONS[button], True)])
            self._send([_btn(BUTTONS[button], False)])

    def button(self, button: str, down: bool) -> None:
        """Press or release a mouse button where the pointer is (OSWorld's MOUSE_DOWN / MOUSE_UP)."""
        if button not in BUTTONS:
            raise InputError(f"unknown mouse button {button!r} (left, right, middle)")
        self._send([_btn(BUTTONS[button], down)])

    def click_here(self, button: str = "left", count: int = 1) -> None:
        """Click where the pointer is, without moving it."""
        for i in range(count):
            if i:
                time.sleep(CLICK_GAP_SECONDS)
            self.button(button, True)
            self.button(button, False)

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

    def wheel(self, clicks: int, horizontal: bool = False) -> None:
        """Turn the wheel where the pointer is: positive ``clicks`` scroll down (or right), negative up (or left)."""
        if horizontal:
            button = "wheel-right" if clicks > 0 else "wheel-left"
        else:
            button = "wheel-down" if clicks > 0 else "wheel-up"
        for _ in range(abs(clicks)):
            self._send([_btn(button, True)])
            self._send([_btn(button, False)])

    def key(self, name: str, down: bool) -> None:
        """Press (``down``) or release one key by pyautogui's name. A character that needs shift is pressed
        with shift held only around the key, as pyautogui's ``keyDown`` does on X."""
        code, shift = pyautogui_key(name)
        events = [_key(code, down)]
        if shift and down:
            events = [_key("shift", True), *events, _key("shift", False)]
        self._send(events)

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

    def drag(self, x1: int, y1: int, x2: int, y2: int, steps: int = 8) -> None:
        self.move(x1, y1)
        self._abs(x2, y2)  # validate before pressing
        self._send([_btn("left", True)])
        try:
            for i in range(1, steps + 1):
                self.move(round(x1 + (x2 - x1) * i / steps), round(y1 + (y2 - y1) * i / steps))
                time.sleep(0.01)
        finally:  # a failed move must not leave the guest's button held down for the next action
            self._send([_btn("left", False)])

    def scroll(self, x: int, y: int, clicks: int) -> None:
        """Positive ``clicks`` scroll down, negative up."""
        self.move(x, y)
        self.wheel(clicks)

    def type_text(self, text: str) -> None:
        keys = [key_for_char(ch) for ch in text]  # refuse the whole text before typing any of it
        for i, (code, shift) in enumerate(keys):
            events = [_key(code, True), _key(code, False)]
            if shift:
                events = [_key("shift", True), *events, _key("shift", False)]
            try:
                self._send(events)
            except keyboard_flow.KeyboardStalledError as exc:
                raise InputError(f"typed {i} of {len(keys)} characters: {exc}") from None
            time.sleep(KEY_GAP_SECONDS)
        self.keyboard.drain()  # every key sent; returns once the guest has read them (or stopped reading)

    def hotkey(self, keys: list[str]) -> None:
        """Press ``keys`` together (e.g. ["ctrl", "s"]) and release them in reverse order."""
        if not keys:
            raise InputError("a hotkey needs at least one key")
        codes = [qcode(k) for k in keys]
        self._send([_key(c, True) for c in codes])
        self._send([_key(c, False) for c in reversed(codes)])
