"""OSWorld's ``computer_13`` action space on osfleet's input primitives (QEMU input events, ``input.Input``).

OSWorld turns each of these actions into a pyautogui call in the VM; here each becomes the same pointer and key
events sent at the hypervisor, so they cost no guest process and work whatever the guest runs (but a sideways
``SCROLL``, which the guest's X server does: ``input.Input._sideways``). Meanings follow
OSWorld's controller: coordinates are screen pixels (floats are rounded); a click, right click or double click
without coordinates happens where the pointer is; ``DRAG_TO`` holds the left button from where the pointer is;
``SCROLL``'s ``dy`` > 0 scrolls up and ``dx`` > 0 right (pyautogui's ``vscroll``/``hscroll``); ``PRESS``,
``KEY_DOWN`` and ``KEY_UP`` take pyautogui's key names or one character (``"A"`` is shift+a); ``TYPING`` types any
Unicode text (``Input.type_text``; pyautogui's ``typewrite`` skips what the US keyboard lacks); ``WAIT`` waits a
second; ``DONE`` and ``FAIL`` do nothing in the guest (they end the episode; ``FAIL`` declares the task
infeasible, see ``actions.declares_infeasible``).
"""

from __future__ import annotations

import time

from osfleet.protocol import actions as a
from osfleet.replicas.input import Input, InputError, check_text, pyautogui_key


def points(action: a.Computer13Action) -> list[tuple[int, int]]:
    """The screen points ``action`` acts on (none when it acts where the pointer is)."""
    p = action.parameters
    x, y = getattr(p, "x", None), getattr(p, "y", None)
    return [] if x is None or y is None else [(round(x), round(y))]


def check(action: a.Computer13Action, size: tuple[int, int]) -> None:
    """Refuse (``InputError``, 422) what cannot be sent as given: off-screen points, untypable text, unknown keys."""
    w, h = size
    for x, y in points(action):
        if not (0 <= x < w and 0 <= y < h):
            raise InputError(f"computer_13 {action.action_type}: ({x}, {y}) is off the {w}x{h} screen")
    match action:
        case a.C13Typing(parameters=p):
            check_text(p.text)
        case a.C13Press(parameters=p) | a.C13KeyDown(parameters=p) | a.C13KeyUp(parameters=p):
            pyautogui_key(p.key)
        case a.C13Hotkey(parameters=p):
            for k in p.keys:
                pyautogui_key(k)


def apply(pointer: Input, action: a.Computer13Action, left: float) -> None:
    """Send ``action`` (checked by ``check``); ``left``: seconds the step still has (a WAIT is cut to it)."""
    at = points(action)
    match action:
        case a.C13MoveTo():
            pointer.move(*at[0])
        case a.C13Click(parameters=p):
            if at:
                pointer.move(*at[0])
            pointer.click_here(p.button, p.num_clicks)
        case a.C13RightClick():
            if at:
                pointer.move(*at[0])
            pointer.click_here("right")
        case a.C13DoubleClick():
            if at:
                pointer.move(*at[0])
            pointer.click_here("left", 2)
        case a.C13MouseDown(parameters=p):
            pointer.button(p.button, True)
        case a.C13MouseUp(parameters=p):
            pointer.button(p.button, False)
        case a.C13DragTo():
            pointer.drag_to(*at[0])
        case a.C13Scroll(parameters=p):
            if p.dx:
                pointer.wheel(p.dx, horizontal=True)
            if p.dy:
                pointer.wheel(-p.dy)  # pyautogui: positive scrolls up; osfleet's wheel: positive scrolls down
        case a.C13Typing(parameters=p):
            pointer.type_text(p.text)
        case a.C13Press(parameters=p):
            pointer.press([p.key])
        case a.C13KeyDown(parameters=p):
            pointer.key(p.key, True)
        case a.C13KeyUp(parameters=p):
            pointer.key(p.key, False)
        case a.C13Hotkey(parameters=p):
            pointer.key_combo(p.keys)
        case a.C13Wait():
            time.sleep(max(0.0, min(a.OSWORLD_WAIT_SECONDS, left)))
        case a.C13Done() | a.C13Fail():
            pass
