"""Gymnasium spaces for a desktop: the screen as an image, osfleet's GUI actions as a ``Dict`` space.

The action space is one flat ``Dict`` (an action ``type`` plus every parameter any type takes), because every
RL library can sample, batch and flatten a ``Dict`` of simple spaces, while a union of differently shaped
actions is not a Gymnasium space. ``to_action`` picks the parameters the chosen type uses. Shell commands and
file reads are not in the space (a policy acts as the desktop user through the screen); they can still be sent
as native osfleet action dicts to ``step``.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

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
