"""Between model APIs and osfleet: observations as chat message parts, computer-use tool calls as actions.

Models see a screen that is often smaller than the desktop (a vision encoder's preferred size), so
``for_model`` resizes a screen and remembers the scale, and the action translators map the model's coordinates
back to the desktop's pixels. Two tool-call shapes are understood, as the two big APIs publish them:
- Anthropic's computer-use tool input: ``{"action": "left_click", "coordinate": [x, y]}``, ``type``/``key``
  with ``text``, ``scroll`` with ``scroll_direction``/``scroll_amount``, ``left_click_drag`` with
  ``start_coordinate``, ``mouse_move``, ``double_click``, ``triple_click``, ``right_click``, ``middle_click``,
  ``wait`` with ``duration``, ``screenshot``;
- OpenAI's computer-use action: ``{"type": "click", "x", "y", "button"}``, ``double_click``, ``move``,
  ``scroll`` with ``scroll_x``/``scroll_y``, ``type``, ``keypress`` with ``keys``, ``drag`` with ``path``,
  ``wait``, ``screenshot``.
A ``screenshot`` request maps to no action (the next observation is the screenshot). Anything else raises
``InvalidActionError`` naming it, before anything reaches a desktop.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from osfleet.client.errors import InvalidActionError
from osfleet.client.types import Screen

SCROLL_CLICKS_PER_UNIT = 1
OPENAI_SCROLL_PIXELS_PER_CLICK = 100  # OpenAI's scroll_y is in pixels; one wheel click scrolls about this much
KEY_ALIASES = {
    "return": "enter", "kp_enter": "enter", "escape": "esc", "arrowleft": "left", "arrowright": "right",
    "arrowup": "up", "arrowdown": "down", "page_up": "pgup", "page_down": "pgdn", "prior": "pgup", "next": "pgdn",
    "control": "ctrl", "control_l": "ctrl", "control_r": "ctrl", "ctrl_l": "ctrl", "alt_l": "alt", "alt_r": "alt",
    "shift_l": "shift", "shift_r": "shift", "super_l": "super", "super_r": "super", "cmd": "super",
    "meta": "super", "win": "super", "backspace": "backspace", "delete": "delete", "space": "space",
    "minus": "-", "equal": "=", "plus": "=", "comma": ",", "period": ".", "slash": "/", "semicolon": ";",
    "apostrophe": "'", "grave": "`", "bracketleft": "[", "bracketright": "]", "backslash": "\\",
}  # fmt: skip


@dataclass(frozen=True)
class ModelView:
    """The screen as a model sees it, and how to map its coordinates back to the desktop's."""

    screen: Screen
    scale_x: float
    scale_y: float
    desktop_width: int
    desktop_height: int

    def to_desktop(self, x: float, y: float) -> tuple[int, int]:
        """Model pixels to desktop pixels, clamped to the screen."""
        dx = min(max(round(x * self.scale_x), 0), self.desktop_width - 1)
        dy = min(max(round(y * self.scale_y), 0), self.desktop_height - 1)
        return dx, dy


def for_model(
    screen: Screen, max_width: int | None = None, max_height: int | None = None, format: str = "png"
) -> ModelView:
    """``screen`` shrunk (aspect kept) to fit ``max_width`` x ``max_height`` (no upscaling)."""
    w, h = screen.width, screen.height
    factor = min((max_width or w) / w, (max_height or h) / h, 1.0)
    if factor >= 1.0 and format == screen.format:
        return ModelView(screen, 1.0, 1.0, w, h)
    nw, nh = max(1, round(w * factor)), max(1, round(h * factor))
    image = screen.image().resize((nw, nh)) if (nw, nh) != (w, h) else screen.image()
    buf = io.BytesIO()
    image.save(buf, {"jpeg": "JPEG", "webp": "WEBP"}.get(format, "PNG"))
    small = Screen(buf.getvalue(), format, nw, nh)
    return ModelView(small, w / nw, h / nh, w, h)


def openai_content(
    view: ModelView | Screen, instruction: str | None = None, detail: str = "auto"
) -> list[dict[str, Any]]:
    """Parts of an OpenAI-style chat ``user`` message: the instruction (if any), then the screen as a data URL."""
    screen = view.screen if isinstance(view, ModelView) else view
    parts: list[dict[str, Any]] = [{"type": "text", "text": instruction}] if instruction else []
    url = f"data:{screen.media_type};base64,{screen.base64()}"
    parts.append({"type": "image_url", "image_url": {"url": url, "detail": detail}})
    return parts


def anthropic_content(view: ModelView | Screen, instruction: str | None = None) -> list[dict[str, Any]]:
    """Content blocks of an Anthropic-style ``user`` message: the instruction (if any), then the screen."""
    screen = view.screen if isinstance(view, ModelView) else view
    blocks: list[dict[str, Any]] = [{"type": "text", "text": instruction}] if instruction else []
    blocks.append(
        {"type": "image", "source": {"type": "base64", "media_type": screen.media_type, "data": screen.base64()}}
    )
    return blocks


def _key(name: str) -> str:
    n = name.strip().lower()
    return KEY_ALIASES.get(n, n)


def _keys(combo: str) -> list[str]:
    return [_key(k) for k in combo.replace(" ", "+").split("+") if k]


def _point(view: ModelView | None, xy: Any, what: str) -> tuple[int, int]:
    try:
        x, y = float(xy[0]), float(xy[1])
    except (TypeError, ValueError, IndexError):
        raise InvalidActionError(f"{what}: expected [x, y], got {xy!r}", kind="invalid_action") from None
    if view is None:
        return round(x), round(y)
    return view.to_desktop(x, y)


def from_anthropic(tool_input: dict[str, Any], view: ModelView | None = None) -> list[dict[str, Any]]:
    """osfleet actions for one Anthropic computer-use tool input."""
    act = tool_input.get("action")
    xy = tool_input.get("coordinate")
    if act in ("left_click", "double_click", "triple_click", "right_click", "middle_click", "mouse_move"):
        x, y = _point(view, xy, str(act))
        if act == "mouse_move":
            return [{"type": "move", "x": x, "y": y}]
        if act == "double_click":
            return [{"type": "double_click", "x": x, "y": y}]
        if act == "triple_click":
            return [{"type": "double_click", "x": x, "y": y}, {"type": "click", "x": x, "y": y}]
        button = {"left_click": "left", "right_click": "right", "middle_click": "middle"}[act]
        return [{"type": "click", "x": x, "y": y, "button": button}]
    if act == "left_click_drag":
        x1, y1 = _point(view, tool_input.get("start_coordinate"), "left_click_drag start_coordinate")
        x2, y2 = _point(view, xy, "left_click_drag coordinate")
        return [{"type": "drag", "x1": x1, "y1": y1, "x2": x2, "y2": y2}]
    if act == "type":
        return [{"type": "type", "text": str(tool_input.get("text", ""))}]
    if act == "key":
        return [{"type": "hotkey", "keys": _keys(str(tool_input.get("text", "")))}]
    if act == "scroll":
        x, y = _point(view, xy, "scroll")
        amount = int(tool_input.get("scroll_amount", 3)) * SCROLL_CLICKS_PER_UNIT
        direction = tool_input.get("scroll_direction", "down")
        if direction not in ("up", "down"):
            raise InvalidActionError(
                f"scroll_direction {direction!r}: only up and down scroll here", kind="invalid_action"
            )
        return [{"type": "scroll", "x": x, "y": y, "clicks": amount if direction == "down" else -amount}]
    if act == "wait":
        return [{"type": "wait", "seconds": min(float(tool_input.get("duration", 1.0)), 60.0)}]
    if act in ("screenshot", "cursor_position"):
        return []
    raise InvalidActionError(f"unsupported computer-use action {act!r}", kind="invalid_action")


def from_openai(action: dict[str, Any], view: ModelView | None = None) -> list[dict[str, Any]]:
    """osfleet actions for one OpenAI computer-use action."""
    kind = action.get("type")
    if kind in ("click", "double_click", "move"):
        x, y = _point(view, (action.get("x"), action.get("y")), str(kind))
        if kind == "click":
            button = action.get("button", "left")
            if button not in ("left", "right", "middle"):
                raise InvalidActionError(f"click button {button!r}: left, right or middle", kind="invalid_action")
            return [{"type": "click", "x": x, "y": y, "button": button}]
        return [{"type": kind, "x": x, "y": y}]
    if kind == "scroll":
        x, y = _point(view, (action.get("x"), action.get("y")), "scroll")
        pixels = float(action.get("scroll_y", 0))
        clicks = round(pixels / OPENAI_SCROLL_PIXELS_PER_CLICK) or (1 if pixels > 0 else -1 if pixels < 0 else 0)
        return [{"type": "scroll", "x": x, "y": y, "clicks": max(-50, min(50, clicks))}] if clicks else []
    if kind == "type":
        return [{"type": "type", "text": str(action.get("text", ""))}]
    if kind == "keypress":
        keys = action.get("keys") or []
        return [{"type": "hotkey", "keys": [_key(str(k)) for k in keys]}]
    if kind == "drag":
        path = action.get("path") or []
        if len(path) < 2:
            raise InvalidActionError("drag: a path of at least two points", kind="invalid_action")
        x1, y1 = _point(view, (path[0].get("x"), path[0].get("y")), "drag start")
        x2, y2 = _point(view, (path[-1].get("x"), path[-1].get("y")), "drag end")
        return [{"type": "drag", "x1": x1, "y1": y1, "x2": x2, "y2": y2}]
    if kind == "wait":
        return [{"type": "wait", "seconds": 1.0}]
    if kind == "screenshot":
        return []
    raise InvalidActionError(f"unsupported computer-use action {kind!r}", kind="invalid_action")


__all__ = ["ModelView", "anthropic_content", "for_model", "from_anthropic", "from_openai", "openai_content"]
