"""The vendors' computer-use calls as osfleet actions, for the drivers (``osfleet.client.anthropic``,
``osfleet.client.openai``) and for agent loops of one's own (``osfleet.client.messages``): the screen as the model
sees it and back, Anthropic's members and OpenAI's actions translated, and a batch of actions run as steps.

A model sees screenshots no larger than its vendor's image limits; the driver scales them (the host scales: only
the small image crosses the network) and maps every coordinate the model sends back to the desktop's pixels. A
point outside the screenshot is refused (``InvalidActionError``, the model reads why), never clamped onto the
screen: a model that clicks off its own screenshot is wrong, and a clamped click lands somewhere it did not mean.

Nothing here imports a vendor's SDK: a client-only install has no SDK at all, and each driver module imports its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from osfleet.client.errors import FleetError, InvalidActionError
from osfleet.client.fleet import AsyncSession
from osfleet.client.types import StepResult
from osfleet.protocol.actions import MAX_WHEEL_CLICKS

MAX_STEP_ACTIONS = 100  # a step's actions at most (``protocol.models.StepRequest``)
SCROLL_PIXELS_PER_CLICK = 100  # OpenAI's scroll amounts are pixels; one wheel click scrolls about this far
ANTHROPIC_MAX_LONG_SIDE = 1568  # pixels on an image's long side that Anthropic's models take without resizing
ANTHROPIC_MAX_PIXELS = 1_150_000  # and in all (about 1.15 megapixels)
MAX_TYPE_CHARS = 10000  # one osfleet ``type`` action's text; longer text goes as several
MAX_KEY_PRESSES = 1000  # presses one Anthropic ``key`` call may ask for (its combinations times ``repeat``)
OPENAI_WAIT_SECONDS = 2.0  # what OpenAI's ``wait`` waits: the GA action has no duration
ANTHROPIC_BUTTONS = {"left_click": ("left", 1), "right_click": ("right", 1), "middle_click": ("middle", 1)}
ANTHROPIC_BUTTONS |= {"double_click": ("left", 2), "triple_click": ("left", 3)}
ANTHROPIC_SCROLLS = {"down": ("clicks", 1), "up": ("clicks", -1), "right": ("clicks_x", 1), "left": ("clicks_x", -1)}
OPENAI_BUTTONS = {"left": "left", "right": "right", "wheel": "middle", "middle": "middle"}
OPENAI_BUTTONS |= {"back": "back", "forward": "forward"}
Limits = tuple[int | None, int | None]  # (long side, pixels in all) of the model's images; None: no limit


def _bad(message: str) -> InvalidActionError:
    return InvalidActionError(message, status=422, kind="invalid_action")


@dataclass(frozen=True)
class View:
    """The desktop's ``screen`` and the size the model sees it at (``shown``), in pixels."""

    screen: tuple[int, int]
    shown: tuple[int, int]

    @classmethod
    def fit(cls, screen: tuple[int, int], max_long_side: int | None = None, max_pixels: int | None = None) -> View:
        """The screen shown as large as the limits allow (never enlarged): at most ``max_long_side`` pixels on the
        long side and ``max_pixels`` in all, aspect ratio kept."""
        return cls(screen, fit_within(screen, max_long_side, max_pixels, enlarge=False))

    @property
    def scaled(self) -> bool:
        return self.shown != self.screen

    def to_screen(self, x: int, y: int, what: str = "") -> tuple[int, int]:
        """A point of the screenshot as the desktop's pixel (the centre of what the model pointed at)."""
        (sw, sh), (w, h) = self.screen, self.shown
        if not (0 <= x < w and 0 <= y < h):
            raise _bad(f"{what}({x}, {y}) is off the {w}x{h} screen")
        return math.floor((x + 0.5) * sw / w), math.floor((y + 0.5) * sh / h)

    def to_shown(self, x: int, y: int) -> tuple[int, int]:
        """A desktop pixel as the screenshot's."""
        (sw, sh), (w, h) = self.screen, self.shown
        return min(w - 1, math.floor((x + 0.5) * w / sw)), min(h - 1, math.floor((y + 0.5) * h / sh))

    def region_to_screen(self, region: Sequence[int]) -> list[int]:
        """A region of the screenshot, [x0, y0, x1, y1] (x0 <= x < x1), as the desktop's pixels that cover it."""
        if len(region) != 4:
            raise _bad(f"a region is [x0, y0, x1, y1], not {list(region)}")
        x0, y0, x1, y1 = region
        (sw, sh), (w, h) = self.screen, self.shown
        if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
            raise _bad(f"region {list(region)} is not inside the {w}x{h} screen (0 <= x0 < x1 <= {w}, y likewise)")
        return [
            math.floor(x0 * sw / w),
            math.floor(y0 * sh / h),
            min(sw, math.ceil(x1 * sw / w)),
            min(sh, math.ceil(y1 * sh / h)),
        ]


def fit_within(
    size: tuple[int, int], max_long_side: int | None, max_pixels: int | None, *, enlarge: bool
) -> tuple[int, int]:
    """``size`` scaled (aspect ratio kept) to fill the limits: shrunk when over them, and enlarged to them when
    ``enlarge`` (a zoom fills the model's image budget so details become legible)."""
    w, h = size
    factors = [math.inf] if enlarge else [1.0]
    if max_long_side is not None:
        factors.append(max_long_side / max(w, h))
    if max_pixels is not None:
        factors.append(math.sqrt(max_pixels / (w * h)))
    factor = min(factors)
    if math.isinf(factor):
        return size
    return max(1, math.floor(w * factor)), max(1, math.floor(h * factor))


def key_combos(text: str) -> list[list[str]]:
    """xdotool's key syntax, as Anthropic's ``key`` and ``hold_key`` take it: combinations joined by "+" ("ctrl+s",
    "ctrl+shift+Escape"; "ctrl++" and "+" name the plus key), several separated by spaces ("ctrl+a Delete")."""
    combos = []
    for word in text.split():
        keys = word[:-2].split("+") + ["+"] if word.endswith("++") else word.split("+")
        if word == "+":
            keys = ["+"]
        if any(not k for k in keys):
            raise _bad(f"{word!r} is not a key combination (names joined by '+', e.g. ctrl+s)")
        combos.append(keys)
    if not combos:
        raise _bad("no key given")
    return combos


def wheel(amount: int) -> list[int]:
    """``amount`` wheel clicks (signed) as the per-action amounts a step takes (at most ``MAX_WHEEL_CLICKS`` each)."""
    sign = 1 if amount > 0 else -1
    left, out = abs(amount), []
    while left > 0:
        out.append(sign * min(left, MAX_WHEEL_CLICKS))
        left -= MAX_WHEEL_CLICKS
    return out


def pixels_to_clicks(pixels: int) -> int:
    """A scroll distance in pixels as wheel clicks: at least one for any distance but 0."""
    if pixels == 0:
        return 0
    return int(math.copysign(max(1, round(abs(pixels) / SCROLL_PIXELS_PER_CLICK)), pixels))


def _point(view: View | None, x: Any, y: Any, what: str) -> dict[str, int]:
    """A point the model gave, as the desktop's pixel; unchecked when the screen's size is not known here (the host
    then refuses a point off its screen)."""
    for value in (x, y):
        if not isinstance(value, int) or isinstance(value, bool):
            raise _bad(f"{what}a point is [x, y] in whole pixels, not [{x!r}, {y!r}]")
    sx, sy = (x, y) if view is None else view.to_screen(x, y, what)
    return {"x": sx, "y": sy}


def _held(text: Any, name: str) -> list[str]:
    """Anthropic's ``text`` on a pointer member: the keys held during it ("ctrl", "ctrl+shift")."""
    if not text:
        return []
    combos = key_combos(str(text))
    if len(combos) != 1:
        raise _bad(f"{name}: the keys held are one combination (e.g. ctrl+shift), not {text!r}")
    return combos[0]


def anthropic_actions(
    view: View | None,
    name: str,
    given: Mapping[str, Any],
    zoom: Limits = (ANTHROPIC_MAX_LONG_SIDE, ANTHROPIC_MAX_PIXELS),
) -> list[dict[str, Any]]:
    """The osfleet actions of one of Anthropic's computer members (``computer_toolset_20260801``'s member, or
    ``computer_20251124``'s ``action``) with its input. ``screenshot`` and ``zoom`` become a ``screenshot`` action
    (scaled to the view; a zoom fills the ``zoom`` limits), ``cursor_position`` its action (answered in the desktop's
    pixels)."""

    def at(field: str = "coordinate", required: bool = False) -> dict[str, int]:
        point = given.get(field)
        if point is None:
            if required:
                raise _bad(f"{name}: {field} is needed")
            return {}
        if not isinstance(point, Sequence) or len(point) != 2:
            raise _bad(f"{name}: {field} is [x, y], not {point!r}")
        return _point(view, point[0], point[1], f"{name}: ")

    if name == "screenshot":
        return [
            {
                "type": "screenshot",
                **({"width": view.shown[0], "height": view.shown[1]} if view and view.scaled else {}),
            }
        ]
    if name == "zoom":
        region = given.get("region")
        if not isinstance(region, Sequence):
            raise _bad("zoom: region [x0, y0, x1, y1] is needed")
        box = view.region_to_screen(region) if view is not None else list(region)
        if len(box) != 4 or box[2] <= box[0] or box[3] <= box[1]:
            raise _bad(f"zoom: region {list(region)} is not [x0, y0, x1, y1] with x0 < x1 and y0 < y1")
        width, height = fit_within((box[2] - box[0], box[3] - box[1]), *zoom, enlarge=True)
        return [{"type": "screenshot", "region": box, "width": width, "height": height}]
    if name == "cursor_position":
        return [{"type": "cursor_position"}]
    if name in ANTHROPIC_BUTTONS:
        button, count = ANTHROPIC_BUTTONS[name]
        return [{"type": "click", "button": button, "count": count, "keys": _held(given.get("text"), name), **at()}]
    if name == "mouse_move":
        return [{"type": "move", **at(required=True)}]
    if name in ("left_mouse_down", "left_mouse_up"):
        return [{"type": "mouse_down" if name == "left_mouse_down" else "mouse_up", "button": "left", **at()}]
    if name == "left_click_drag":
        start, end = at("start_coordinate", required=True), at(required=True)
        path = [[start["x"], start["y"]], [end["x"], end["y"]]]
        return [{"type": "drag", "path": path, "keys": _held(given.get("text"), name)}]
    if name == "scroll":
        direction, amount = given.get("scroll_direction"), given.get("scroll_amount", 3)
        if direction not in ANTHROPIC_SCROLLS:
            raise _bad(f"scroll: scroll_direction is up, down, left or right, not {direction!r}")
        if not isinstance(amount, int) or amount < 0:
            raise _bad(f"scroll: scroll_amount is a number of wheel clicks, at least 0, not {amount!r}")
        field, sign = ANTHROPIC_SCROLLS[direction]
        keys, where = _held(given.get("text"), name), at()
        turns = [{"type": "scroll", field: sign * n, "keys": keys, **where} for n in wheel(amount)]
        return turns or ([{"type": "move", **where}] if where else [])
    if name == "key":
        repeat = given.get("repeat") or 1
        combos = key_combos(str(given.get("text") or ""))
        if not isinstance(repeat, int) or not 1 <= repeat * len(combos) <= MAX_KEY_PRESSES:
            raise _bad(f"key: repeat is 1 to {MAX_KEY_PRESSES // len(combos)} here, not {repeat!r}")
        return [{"type": "hotkey", "keys": keys} for _ in range(repeat) for keys in combos]
    if name == "hold_key":
        combos = key_combos(str(given.get("text") or ""))
        if len(combos) != 1:
            raise _bad(f"hold_key: one combination is held (e.g. shift or ctrl+shift), not {given.get('text')!r}")
        return [{"type": "hold_key", "keys": combos[0], "seconds": given.get("duration", 1)}]
    if name == "type":
        text = str(given.get("text") or "")
        return [{"type": "type", "text": text[i : i + MAX_TYPE_CHARS]} for i in range(0, len(text), MAX_TYPE_CHARS)]
    if name == "wait":
        return [{"type": "wait", "seconds": given.get("duration", 1)}]
    raise _bad(f"{name!r} is not one of Anthropic's computer actions")


def _field(item: Any, name: str, default: Any = None) -> Any:
    """A field of an item given as a dict or as an SDK's model."""
    if isinstance(item, Mapping):
        return item.get(name, default)
    return getattr(item, name, default)


def openai_actions(view: View | None, action: Any) -> list[dict[str, Any]]:
    """The osfleet actions of one of OpenAI's GA computer actions (a dict or ``openai``'s model); ``screenshot``
    is none (the caller takes the screen)."""
    kind = _field(action, "type")
    keys = list(_field(action, "keys") or [])

    def at() -> dict[str, int]:
        return _point(view, _field(action, "x"), _field(action, "y"), f"{kind}: ")

    if kind == "click":
        button = _field(action, "button") or "left"
        if button not in OPENAI_BUTTONS:
            raise _bad(f"click: unknown button {button!r} ({', '.join(OPENAI_BUTTONS)})")
        return [{"type": "click", "button": OPENAI_BUTTONS[button], "keys": keys, **at()}]
    if kind == "double_click":
        return [{"type": "click", "count": 2, "keys": keys, **at()}]
    if kind == "move":
        return [{"type": "move", "keys": keys, **at()}]
    if kind == "drag":
        points = [_point(view, _field(p, "x"), _field(p, "y"), "drag: ") for p in _field(action, "path") or []]
        if len(points) < 2:
            raise _bad("drag: a path needs at least two points")
        return [{"type": "drag", "path": [[p["x"], p["y"]] for p in points], "keys": keys}]
    if kind == "scroll":
        where = at()
        down, right = _field(action, "scroll_y", 0), _field(action, "scroll_x", 0)
        for value in (down, right):
            if not isinstance(value, int) or isinstance(value, bool):
                raise _bad(f"scroll: scroll_x and scroll_y are whole pixels, not {value!r}")
        out = [{"type": "scroll", "clicks": n, "keys": keys, **where} for n in wheel(pixels_to_clicks(down))]
        out += [{"type": "scroll", "clicks_x": n, "keys": keys, **where} for n in wheel(pixels_to_clicks(right))]
        return out or [{"type": "move", **where}]
    if kind == "keypress":
        names = [str(k) for k in _field(action, "keys") or []]
        if not names:
            raise _bad("keypress: no keys")
        return [{"type": "hotkey", "keys": names}]
    if kind == "type":
        text = str(_field(action, "text") or "")
        return [{"type": "type", "text": text[i : i + MAX_TYPE_CHARS]} for i in range(0, len(text), MAX_TYPE_CHARS)]
    if kind == "wait":
        return [{"type": "wait", "seconds": OPENAI_WAIT_SECONDS}]
    if kind == "screenshot":
        return []
    raise _bad(f"{kind!r} is not one of OpenAI's computer actions")


def steps_of(actions: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A list of actions as steps of at most ``MAX_STEP_ACTIONS`` each."""
    return [actions[i : i + MAX_STEP_ACTIONS] for i in range(0, len(actions), MAX_STEP_ACTIONS)] or [[]]


async def run(session: AsyncSession, actions: list[dict[str, Any]], *, observe: bool = False) -> list[StepResult]:
    """Run ``actions`` in order as one step (or a few, when there are more than a step takes); an action that failed
    in the guest raises ``FleetError`` with its reason, and the actions after it are not run."""
    out = []
    for batch in steps_of(actions):
        if not batch:
            continue
        result = await session.step(batch, observe=observe)
        out.append(result)
        if result.failed:
            first = result.failed[0]
            raise FleetError(f"{first.type} failed: {first.error}", kind="action_failed")
    return out


async def screen_size(session: AsyncSession) -> tuple[int, int]:
    """The desktop's size in pixels (one small observation)."""
    shot = await session.observe(format="jpeg", quality=1)
    return shot.width, shot.height
