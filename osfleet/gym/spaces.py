"""Gymnasium spaces for a desktop: the screen as an image, and one of three action spaces.

``osfleet`` (the default): osfleet's GUI actions. ``pyautogui``: OSWorld's, a string of Python code using
``pyautogui`` (or ``WAIT``, ``DONE``, ``FAIL``), run in the guest as OSWorld runs it. ``computer_13``: OSWorld's 16
structured actions, sampled from a flat ``Dict`` like osfleet's, or given as OSWorld's own dicts
(``{"action_type": "CLICK", "parameters": {...}}``).

The action space is one flat ``Dict`` (an action ``type`` plus every parameter any type takes), because every
RL library can sample, batch and flatten a ``Dict`` of simple spaces, while a union of differently shaped
actions is not a Gymnasium space. ``to_action`` picks the parameters the chosen type uses. Shell commands and
file reads are not in the space (a policy acts as the desktop user through the screen); they can still be sent
as native osfleet action dicts to ``step``.
"""

from __future__ import annotations

import string
from typing import Any, Literal

import numpy as np
from gymnasium import spaces

from osfleet.protocol.keys import PYAUTOGUI_KEYS

ACTION_TYPES = ("click", "double_click", "right_click", "move", "drag", "scroll", "type", "hotkey", "wait", "terminate")
BUTTONS = ("left", "right", "middle")
HOTKEYS: tuple[tuple[str, ...], ...] = (
    ("enter",), ("tab",), ("esc",), ("backspace",), ("delete",), ("up",), ("down",), ("left",), ("right",),
    ("home",), ("end",), ("pgup",), ("pgdn",), ("ctrl", "a"), ("ctrl", "c"), ("ctrl", "v"), ("ctrl", "x"),
    ("ctrl", "z"), ("ctrl", "s"), ("ctrl", "o"), ("ctrl", "w"), ("alt", "tab"), ("alt", "f4"),
)  # fmt: skip
TYPEABLE = string.ascii_letters + string.digits + " .,-_/:;=+*'\"!?@#%&()[]{}<>~"
MAX_TEXT = 64
MAX_WAIT_SECONDS = 5.0
SCROLL_CLICKS = 10
INSTRUCTION_CHARS = string.printable
MAX_INSTRUCTION = 8192


def screen_space(width: int, height: int) -> spaces.Box:
    return spaces.Box(0, 255, shape=(height, width, 3), dtype=np.uint8)


def instruction_space(extra_chars: str = "") -> spaces.Text:
    return spaces.Text(MAX_INSTRUCTION, min_length=0, charset=frozenset(INSTRUCTION_CHARS + extra_chars))


def action_space(width: int, height: int) -> spaces.Dict:
    return spaces.Dict(
        {
            "type": spaces.Discrete(len(ACTION_TYPES)),
            "x": spaces.Discrete(width),
            "y": spaces.Discrete(height),
            "x2": spaces.Discrete(width),
            "y2": spaces.Discrete(height),
            "button": spaces.Discrete(len(BUTTONS)),
            "scroll": spaces.Discrete(2 * SCROLL_CLICKS + 1, start=-SCROLL_CLICKS),
            "text": spaces.Text(MAX_TEXT, min_length=1, charset=TYPEABLE),
            "hotkey": spaces.Discrete(len(HOTKEYS)),
            "seconds": spaces.Box(0.0, MAX_WAIT_SECONDS, shape=(), dtype=np.float32),
            "success": spaces.Discrete(2),
        }
    )


def to_action(sample: Any) -> dict[str, Any]:
    """The osfleet action (a dict of the server's schema) that a sample of ``action_space`` stands for."""
    kind = ACTION_TYPES[int(sample["type"])]
    x, y = int(sample["x"]), int(sample["y"])
    if kind in ("click",):
        return {"type": kind, "x": x, "y": y, "button": BUTTONS[int(sample["button"])]}
    if kind in ("double_click", "right_click", "move"):
        return {"type": kind, "x": x, "y": y}
    if kind == "drag":
        return {"type": kind, "x1": x, "y1": y, "x2": int(sample["x2"]), "y2": int(sample["y2"])}
    if kind == "scroll":
        return {"type": kind, "x": x, "y": y, "clicks": int(sample["scroll"])}
    if kind == "type":
        return {"type": kind, "text": str(sample["text"])}
    if kind == "hotkey":
        return {"type": kind, "keys": list(HOTKEYS[int(sample["hotkey"])])}
    if kind == "wait":
        return {"type": kind, "seconds": round(float(np.asarray(sample["seconds"])), 3)}
    return {"type": "terminate", "status": "success" if int(sample["success"]) else "failure"}


def native_actions(action: Any) -> list[dict[str, Any]] | None:
    """``action`` as osfleet actions when it is given natively (a dict with a string ``type``, or a list of such),
    else None (a sample of the space)."""
    if isinstance(action, dict) and isinstance(action.get("type"), str):
        return [action]
    if isinstance(action, list) and action and all(isinstance(a, dict) for a in action):
        return list(action)
    return None


# --- OSWorld's action spaces ---------------------------------------------------------------------------------------
ActionSpaceName = Literal["osfleet", "pyautogui", "computer_13"]
ACTION_SPACES: tuple[ActionSpaceName, ...] = ("osfleet", "pyautogui", "computer_13")
MAX_CODE = 100000
CODE_CHARS = string.printable
C13_TYPES = (
    "MOVE_TO", "CLICK", "MOUSE_DOWN", "MOUSE_UP", "RIGHT_CLICK", "DOUBLE_CLICK", "DRAG_TO", "SCROLL", "TYPING",
    "PRESS", "KEY_DOWN", "KEY_UP", "HOTKEY", "WAIT", "FAIL", "DONE",
)  # fmt: skip
C13_KEYS = tuple(sorted(PYAUTOGUI_KEYS)) + tuple(c for c in TYPEABLE if c not in PYAUTOGUI_KEYS)


def pyautogui_space() -> spaces.Text:
    """OSWorld's ``pyautogui`` space: code (printable ASCII; ``step`` also takes any other string)."""
    return spaces.Text(MAX_CODE, min_length=1, charset=CODE_CHARS)


def computer13_space(width: int, height: int) -> spaces.Dict:
    """OSWorld's ``computer_13`` space as one flat ``Dict`` (``to_computer13`` picks what the type uses)."""
    return spaces.Dict(
        {
            "action_type": spaces.Discrete(len(C13_TYPES)),
            "x": spaces.Discrete(width),
            "y": spaces.Discrete(height),
            "button": spaces.Discrete(len(BUTTONS)),
            "num_clicks": spaces.Discrete(3, start=1),
            "dx": spaces.Discrete(2 * SCROLL_CLICKS + 1, start=-SCROLL_CLICKS),
            "dy": spaces.Discrete(2 * SCROLL_CLICKS + 1, start=-SCROLL_CLICKS),
            "text": spaces.Text(MAX_TEXT, min_length=1, charset=TYPEABLE),
            "key": spaces.Discrete(len(C13_KEYS)),
            "hotkey": spaces.Discrete(len(HOTKEYS)),
        }
    )


def to_computer13(sample: Any) -> dict[str, Any]:
    """The ``computer_13`` action (OSWorld's dict) that a sample of ``computer13_space`` stands for."""
    kind = C13_TYPES[int(sample["action_type"])]
    x, y, button = int(sample["x"]), int(sample["y"]), BUTTONS[int(sample["button"])]
    params: dict[str, Any] = {}
    if kind in ("MOVE_TO", "DRAG_TO", "RIGHT_CLICK", "DOUBLE_CLICK"):
        params = {"x": x, "y": y}
    elif kind == "CLICK":
        params = {"x": x, "y": y, "button": button, "num_clicks": int(sample["num_clicks"])}
    elif kind in ("MOUSE_DOWN", "MOUSE_UP"):
        params = {"button": button}
    elif kind == "SCROLL":
        params = {"dx": int(sample["dx"]), "dy": int(sample["dy"])}
    elif kind == "TYPING":
        params = {"text": str(sample["text"])}
    elif kind in ("PRESS", "KEY_DOWN", "KEY_UP"):
        params = {"key": C13_KEYS[int(sample["key"])]}
    elif kind == "HOTKEY":
        params = {"keys": list(HOTKEYS[int(sample["hotkey"])])}
    return {"action_type": kind, "parameters": params}


def space_for(name: ActionSpaceName, width: int, height: int) -> spaces.Space[Any]:
    if name == "pyautogui":
        return pyautogui_space()
    if name == "computer_13":
        return computer13_space(width, height)
    return action_space(width, height)


def actions_in(name: ActionSpaceName, action: Any, space: spaces.Space[Any]) -> list[dict[str, Any]] | None:
    """``action`` as osfleet actions for the ``name`` space: a sample of ``space``, OSWorld's own forms (a code
    string for ``pyautogui``, a ``{"action_type", "parameters"}`` dict or ``"WAIT"``/``"DONE"``/``"FAIL"`` for
    ``computer_13``), or native osfleet action dicts in any space; None when it is none of these."""
    native = native_actions(action)
    if native is not None:
        return native
    if name == "pyautogui" and isinstance(action, str) and action.strip():
        return [{"type": "pyautogui", "command": action}]
    if name == "computer_13":
        if isinstance(action, str) or (isinstance(action, dict) and isinstance(action.get("action_type"), str)):
            return [{"type": "computer_13", "action": action}]
        if space.contains(action):
            return [{"type": "computer_13", "action": to_computer13(action)}]
        return None
    if name == "osfleet" and space.contains(action):
        return [to_action(action)]
    return None
