"""OSGym's action strings -> osfleet actions.

OSGym clients send pixel coordinates (they denormalise before sending) and join several actions with
``&``: ``click(x,y)``, ``left_double(x,y)``, ``right_single(x,y)``, ``drag(x1,y1,x2,y2)``,
``hotkey(a,b)``, ``type(text)``, ``scroll(x,y,d)`` (d > 0 up, d < 0 down; OSGym sends +-50),
``wait()``, ``call_user()``, ``finish()``; and OSWorld's bare ``WAIT``, ``DONE`` and ``FAIL`` (``FAIL``: the agent
declares the task infeasible; the episode ends and is scored as OSWorld scores it). Splitting on ``&`` happens
only outside parentheses, so typed text may contain it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import ValidationError

from osfleet.errors import OsfleetError
from osfleet.protocol.actions import ACTIONS, Action

WAIT_SECONDS = 1.0
SCROLL_UNIT = 10  # OSGym's +-50 becomes 5 wheel clicks
OSWORLD_SPECIAL = ("WAIT", "DONE", "FAIL")  # OSWorld's action strings that are not calls
_CALL = re.compile(r"^\s*([a-z_]+)\((.*)\)\s*$", re.DOTALL)


class ActionStringError(OsfleetError):
    """An OSGym action string is malformed; the message names the part."""


@dataclass
class Parsed:
    actions: list[Action]
    finish: bool = False  # finish() or call_user(): the episode ends and is evaluated
    declared_infeasible: bool = False  # FAIL: OSWorld's way to say the task cannot be done


def split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "&" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _ints(name: str, args: str, n: int) -> list[int]:
    items = [a.strip() for a in args.split(",")] if args.strip() else []
    if len(items) != n:
        raise ActionStringError(f"{name}() takes {n} numbers, got {len(items)}: {name}({args})")
    try:
        return [int(float(a)) for a in items]
    except ValueError:
        raise ActionStringError(f"{name}() takes numbers: {name}({args})") from None


def parse(action: str) -> Parsed:
    if not action or not action.strip():
        raise ActionStringError("empty action")
    out = Parsed(actions=[])
    raw: list[dict[str, object]] = []
    for part in split_top_level(action):
        if part in OSWORLD_SPECIAL:
            out.finish = out.finish or part != "WAIT"
            out.declared_infeasible = part == "FAIL"
            if part == "WAIT":
                raw.append({"type": "wait", "seconds": WAIT_SECONDS})
            continue
        out.declared_infeasible = False  # only the last action counts, as in OSWorld
        m = _CALL.match(part)
        if not m:
            raise ActionStringError(f"not an action call: {part[:80]!r}")
        name, args = m.group(1), m.group(2)
        if name == "click":
            x, y = _ints(name, args, 2)
            raw.append({"type": "click", "x": x, "y": y})
        elif name == "left_double":
            x, y = _ints(name, args, 2)
            raw.append({"type": "double_click", "x": x, "y": y})
        elif name == "right_single":
            x, y = _ints(name, args, 2)
            raw.append({"type": "right_click", "x": x, "y": y})
        elif name == "drag":
            x1, y1, x2, y2 = _ints(name, args, 4)
            raw.append({"type": "drag", "x1": x1, "y1": y1, "x2": x2, "y2": y2})
        elif name == "hotkey":
            keys = [k.strip().strip("'\"") for k in args.split(",") if k.strip()]
            raw.append({"type": "hotkey", "keys": keys})
        elif name == "type":
            raw.append({"type": "type", "text": args})
        elif name == "scroll":
            items = [a.strip() for a in args.split(",")]
            if len(items) != 3:
                raise ActionStringError(f"scroll() takes x, y and an amount: scroll({args})")
            x, y = _ints(name, ",".join(items[:2]), 2)
            d = {"up": 50, "down": -50}.get(items[2]) or _ints(name, items[2], 1)[0]
            clicks = max(1, abs(d) // SCROLL_UNIT) * (-1 if d > 0 else 1)
            raw.append({"type": "scroll", "x": x, "y": y, "clicks": max(-50, min(50, clicks))})
        elif name == "wait":
            raw.append({"type": "wait", "seconds": WAIT_SECONDS})
        elif name in ("finish", "call_user"):
            out.finish = True
        else:
            raise ActionStringError(f"unknown action {name!r}")
    try:
        out.actions = ACTIONS.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ActionStringError(f"invalid action: {first['msg']}") from None
    return out
