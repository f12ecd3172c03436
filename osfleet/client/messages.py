"""Between model APIs and osfleet: observations as chat message parts, computer-use tool calls as actions.

Models see a screen that is often smaller than the desktop (a vision encoder's preferred size), so
``for_model`` resizes a screen and remembers the scale, and the action translators map the model's coordinates
back to the desktop's pixels; a point off the model's screen is refused (``InvalidActionError``), never clamped.
Two tool-call shapes are understood, as the two big APIs publish them (``osfleet.client.computer_use`` translates
them; the drivers ``osfleet.client.anthropic`` and ``osfleet.client.openai`` use the same translation):
- Anthropic's computer-use tool input: ``{"action": "left_click", "coordinate": [x, y]}`` and the other members
  (clicks with held keys in ``text``, ``type``/``key``/``hold_key``, ``scroll`` four ways, ``left_click_drag``,
  mouse down/up, ``mouse_move``, ``wait``, ``screenshot``, ``zoom`` and ``cursor_position``, which become
  ``screenshot`` and ``cursor_position`` actions);
- OpenAI's computer-use action: ``{"type": "click", "x", "y", "button"}``, ``double_click``, ``move``,
  ``scroll`` with ``scroll_x``/``scroll_y``, ``type``, ``keypress`` with ``keys``, ``drag`` with ``path``,
  ``wait``, ``screenshot`` (no action: the next observation is the screenshot).
Anything else raises ``InvalidActionError`` naming it, before anything reaches a desktop.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from osfleet.client.computer_use import View, anthropic_actions, openai_actions
from osfleet.client.errors import InvalidActionError
from osfleet.client.types import Screen


@dataclass(frozen=True)
class ModelView:
    """The screen as a model sees it, and how to map its coordinates back to the desktop's."""

    screen: Screen
    """The screen to send to the model, shrunk to its limits."""
    scale_x: float
    """Desktop pixels per model pixel, across."""
    scale_y: float
    """Desktop pixels per model pixel, down."""
    desktop_width: int
    """The desktop's own width in pixels."""
    desktop_height: int
    """The desktop's own height in pixels."""

    @property
    def view(self) -> View:
        """The desktop and the model's screen, as the translators map between them."""
        return View((self.desktop_width, self.desktop_height), (self.screen.width, self.screen.height))

    def to_desktop(self, x: int, y: int) -> tuple[int, int]:
        """Model pixels to desktop pixels; a point off the model's screen raises ``InvalidActionError``."""
        return self.view.to_screen(x, y)


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


def from_anthropic(tool_input: dict[str, Any], view: ModelView | None = None) -> list[dict[str, Any]]:
    """osfleet actions for one Anthropic computer-use tool input (``screenshot``: none, the next observation is it)."""
    name = tool_input.get("action")
    if not isinstance(name, str):
        raise InvalidActionError(f"a computer-use tool input needs an action, not {name!r}", kind="invalid_action")
    if name == "screenshot":
        return []
    return anthropic_actions(view.view if view else None, name, {k: v for k, v in tool_input.items() if k != "action"})


def from_openai(action: dict[str, Any], view: ModelView | None = None) -> list[dict[str, Any]]:
    """osfleet actions for one OpenAI computer-use action."""
    return openai_actions(view.view if view else None, action)


__all__ = ["ModelView", "anthropic_content", "for_model", "from_anthropic", "from_openai", "openai_content"]
