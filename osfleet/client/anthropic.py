"""Anthropic's computer-use tools, served by an osfleet desktop: an agent written for Claude runs unchanged.

``ComputerToolset(session, confirm=...)`` is the driver Anthropic's SDK asks for: a subclass of
``anthropic.tools.computer.BetaAbstractComputerToolset20260801`` (the ``computer_toolset_20260801`` tool, whose 17
members are tools of their own) that serves every member on a leased osfleet desktop. Give it to
``client.beta.messages.tool_runner(tools=[toolset], ...)``, or answer ``tool_use`` blocks yourself with
``toolset.tool_result(block)``. ``AsyncComputerToolset`` is its twin over ``AsyncSession`` for ``AsyncAnthropic``.
``ComputerTool20251124`` (and ``AsyncComputerTool20251124``) serve the older ``computer_20251124`` tool, one
``computer`` tool with an ``action``, for models that speak it.

What the model sees: screenshots no larger than Anthropic's image limits (``MAX_LONG_SIDE`` and ``MAX_PIXELS``; the
SDK never resizes, and the API refuses a larger image), scaled on the host, and every coordinate it sends mapped
back to the desktop's pixels; ``zoom`` crops a region and scales it up to the same budget. A point off the
screenshot, an unknown key or a region outside the screen is an ``is_error`` result with the reason, never clamped.
Each member is one osfleet step (``osfleet.protocol.actions``): clicks, keys and text go in as QEMU input events.

Anthropic's SDK is an extra: ``pip install 'osfleet[anthropic]'``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

try:
    from anthropic.lib.tools import BetaAsyncBuiltinFunctionTool, BetaBuiltinFunctionTool
    from anthropic.tools import ToolError
    from anthropic.tools.computer import (
        BetaAbstractComputerToolset20260801,
        BetaAsyncAbstractComputerToolset20260801,
        BetaAsyncComputerConfirmCallable,
        BetaComputerConfirmCallable,
        BetaComputerCursorPositionResult,
        BetaComputerMemberResult,
        BetaScreenshotResult,
        BetaToolConfigs,
        BetaToolsetCallContext,
    )
    from anthropic.types.beta import BetaComputerToolsetConfigsParam, BetaToolComputerUse20251124Param
except ImportError as exc:  # pragma: no cover - depends on the install
    # ModuleNotFoundError naming the module, like Python's own: a tool that walks the package sees an extra missing.
    raise ModuleNotFoundError(
        f"osfleet.client.anthropic needs Anthropic's SDK: pip install 'osfleet[anthropic]' ({exc})", name=exc.name
    ) from None

from osfleet.client.computer_use import (
    ANTHROPIC_MAX_LONG_SIDE,
    ANTHROPIC_MAX_PIXELS,
    View,
    anthropic_actions,
    run,
    screen_size,
)
from osfleet.client.errors import FleetError, InfrastructureError
from osfleet.client.fleet import AsyncSession
from osfleet.client.sync import Session

MAX_LONG_SIDE = ANTHROPIC_MAX_LONG_SIDE
"""Pixels on a screenshot's long side at most, by default: what Anthropic's models take as it is."""
MAX_PIXELS = ANTHROPIC_MAX_PIXELS
"""Pixels of a screenshot in all at most, by default (about 1.15 megapixels)."""
TOOL_NAME: Literal["computer"] = "computer"  # the computer_20251124 tool's name
ACKNOWLEDGED = {
    "key": "Pressed {text}.",
    "hold_key": "Held {text} for {duration}s.",
    "type": "Typed.",
    "mouse_move": "Moved the mouse.",
    "left_mouse_down": "Left mouse button pressed.",
    "left_mouse_up": "Left mouse button released.",
    "left_click_drag": "Dragged.",
    "scroll": "Scrolled {scroll_direction}.",
    "wait": "Waited {duration}s.",
    **dict.fromkeys(("left_click", "right_click", "middle_click", "double_click", "triple_click"), "Clicked."),
}  # what computer_20251124's results say (the toolset's own are the SDK's)

Image = tuple[str, str]  # base64 data, media type
Result = Image | tuple[int, int] | None  # an image, the pointer's position, or nothing


class Desktop:
    """The computer members on one leased desktop, as osfleet actions: what the toolsets and tools below share.

    Coordinates the model sends are screenshot pixels (``View``); the desktop's size is asked once, at the first
    member that needs it."""

    def __init__(self, session: AsyncSession, max_long_side: int | None, max_pixels: int | None) -> None:
        self.session = session
        self.limits = (max_long_side, max_pixels)
        self._view: View | None = None

    async def view(self) -> View:
        """The desktop and the screenshot's size (the desktop's is asked once)."""
        if self._view is None:
            self._view = View.fit(await screen_size(self.session), *self.limits)
        return self._view

    def know(self, screen: tuple[int, int]) -> View:
        """Take the desktop's size as given (it need not be asked)."""
        self._view = View.fit(screen, *self.limits)
        return self._view

    async def member(self, name: str, given: Mapping[str, Any]) -> Result:
        """Run one member with its input (the model's, as a dict) and return what it answers."""
        view = await self.view()
        if name == "screenshot" and not view.scaled:  # the screen as it is: an observation, not a step to record
            return (await self.session.observe(format="png")).base64(), "image/png"
        actions = anthropic_actions(view, name, given, self.limits)
        steps = await run(self.session, actions)
        if name == "cursor_position":
            out = steps[-1].results[-1]
            if out.x is None or out.y is None:
                raise FleetError(f"cursor_position on {self.session.replica_id} answered no position")
            return view.to_shown(out.x, out.y)
        if name in ("screenshot", "zoom"):
            data = steps[-1].results[-1].content_base64
            if not data:
                raise FleetError(f"screenshot of {self.session.replica_id} answered no image")
            return data, "image/png"
        return None


def _reason(exc: FleetError) -> str:
    """A fleet's refusal as the line the model reads."""
    if isinstance(exc, InfrastructureError):
        return f"infrastructure: {exc} (not the agent's doing; try again)"
    return str(exc)


def _toolset_result(result: Result) -> BetaComputerMemberResult:
    if result is None:
        return None
    if isinstance(result[0], str):
        data, media = cast(Image, result)
        return BetaScreenshotResult(data=data, media_type=cast(Any, media))
    x, y = cast(tuple[int, int], result)
    return BetaComputerCursorPositionResult(x=x, y=y)


def _given(input: Any) -> dict[str, Any]:
    return dict(input.model_dump(exclude_none=True)) if hasattr(input, "model_dump") else dict(input)


class ComputerToolset(BetaAbstractComputerToolset20260801):
    """Anthropic's ``computer_toolset_20260801`` on a leased osfleet desktop (a ``Session``), every member served.

    ``confirm`` is the SDK's: called before each member call (the SDK requires it while ``type``, ``key`` or
    ``hold_key`` are on). Screenshots are scaled to at most ``max_long_side`` pixels on the long side and
    ``max_pixels`` in all (None: no limit)."""

    def __init__(
        self,
        session: Session,
        *,
        confirm: BetaComputerConfirmCallable | None = None,
        configs: BetaComputerToolsetConfigsParam | None = None,
        tool_configs: BetaToolConfigs | None = None,
        max_long_side: int | None = MAX_LONG_SIDE,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        super().__init__(configs=configs, confirm=confirm, tool_configs=tool_configs)
        self.session = session
        self.desktop = Desktop(session.inner, max_long_side, max_pixels)

    def execute(self, context: BetaToolsetCallContext, name: Any, input: Any) -> BetaComputerMemberResult:
        """Run member ``name`` on the desktop (the SDK calls it once ``confirm`` said yes); a refusal of the fleet
        is a ``ToolError`` the model reads."""
        try:
            return _toolset_result(self.session._loop.run(self.desktop.member(name, _given(input))))
        except FleetError as exc:
            raise ToolError(_reason(exc)) from exc


class AsyncComputerToolset(BetaAsyncAbstractComputerToolset20260801):
    """``ComputerToolset``'s twin for ``AsyncAnthropic``, over an ``AsyncSession``."""

    def __init__(
        self,
        session: AsyncSession,
        *,
        confirm: BetaAsyncComputerConfirmCallable | None = None,
        configs: BetaComputerToolsetConfigsParam | None = None,
        tool_configs: BetaToolConfigs | None = None,
        max_long_side: int | None = MAX_LONG_SIDE,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        super().__init__(configs=configs, confirm=confirm, tool_configs=tool_configs)
        self.session = session
        self.desktop = Desktop(session, max_long_side, max_pixels)

    async def execute(self, context: BetaToolsetCallContext, name: Any, input: Any) -> BetaComputerMemberResult:
        """Run member ``name`` on the desktop; see ``ComputerToolset.execute``."""
        try:
            return _toolset_result(await self.desktop.member(name, _given(input)))
        except FleetError as exc:
            raise ToolError(_reason(exc)) from exc


ConfirmAction = Callable[[str, Mapping[str, Any]], bool]
"""Asked before ``type``, ``key`` and ``hold_key`` with the action and its input; anything but True refuses it."""
CONFIRMED = frozenset({"type", "key", "hold_key"})


def _tool_param(view: View, enable_zoom: bool) -> BetaToolComputerUse20251124Param:
    return {
        "type": "computer_20251124",
        "name": TOOL_NAME,
        "display_width_px": view.shown[0],
        "display_height_px": view.shown[1],
        "enable_zoom": enable_zoom,
    }


def _tool_input(input: object, confirm: ConfirmAction | None) -> tuple[str, dict[str, Any]]:
    """The action and its input of a ``computer_20251124`` call; a refusal is a ``ToolError``."""
    if not isinstance(input, Mapping) or not isinstance(input.get("action"), str):
        raise ToolError("the computer tool's input needs an action")
    given = {k: v for k, v in input.items() if k != "action" and v is not None}
    action = cast(str, input["action"])
    if action in CONFIRMED and confirm is not None and confirm(action, given) is not True:
        raise ToolError(f"{action} was declined")
    return action, given


def _tool_content(action: str, given: Mapping[str, Any], result: Result) -> Any:
    if result is None:
        text = ACKNOWLEDGED.get(action, "Done.")
        return [
            {
                "type": "text",
                "text": text.format_map({k: given.get(k, "") for k in ("text", "duration", "scroll_direction")}),
            }
        ]
    if isinstance(result[0], str):
        data, media = cast(Image, result)
        return [{"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}]
    x, y = cast(tuple[int, int], result)
    return [{"type": "text", "text": f"X={x},Y={y}"}]


class ComputerTool20251124(BetaBuiltinFunctionTool):
    """The older ``computer_20251124`` tool (one ``computer`` tool with an ``action``) on a leased desktop, for the
    models that speak it; the same actions, limits and errors as ``ComputerToolset``. ``confirm(action, input)``
    is asked before ``type``, ``key`` and ``hold_key``."""

    def __init__(
        self,
        session: Session,
        *,
        confirm: ConfirmAction | None = None,
        enable_zoom: bool = True,
        max_long_side: int | None = MAX_LONG_SIDE,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        super().__init__()
        self.session, self.confirm, self.enable_zoom = session, confirm, enable_zoom
        self.desktop = Desktop(session.inner, max_long_side, max_pixels)

    def to_dict(self) -> BetaToolComputerUse20251124Param:  # type: ignore[override]
        """The ``tools[]`` entry: ``computer_20251124`` with the screenshot's size."""
        return _tool_param(self.session._loop.run(self.desktop.view()), self.enable_zoom)

    def call(self, input: object) -> Any:
        """Run one ``action`` with its input; the ``tool_result`` content, or a ``ToolError`` with the reason."""
        action, given = _tool_input(input, self.confirm)
        try:
            return _tool_content(action, given, self.session._loop.run(self.desktop.member(action, given)))
        except FleetError as exc:
            raise ToolError(_reason(exc)) from exc


class AsyncComputerTool20251124(BetaAsyncBuiltinFunctionTool):
    """``ComputerTool20251124`` for ``AsyncAnthropic``. ``screen`` is the desktop's size in pixels (the tool's
    definition states it, and is built outside the event loop): e.g. ``(shot.width, shot.height)`` of
    ``await session.observe()``."""

    def __init__(
        self,
        session: AsyncSession,
        *,
        screen: tuple[int, int],
        confirm: ConfirmAction | None = None,
        enable_zoom: bool = True,
        max_long_side: int | None = MAX_LONG_SIDE,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        super().__init__()
        self.session, self.confirm, self.enable_zoom = session, confirm, enable_zoom
        self.desktop = Desktop(session, max_long_side, max_pixels)
        self.view = self.desktop.know(screen)

    def to_dict(self) -> BetaToolComputerUse20251124Param:  # type: ignore[override]
        """The ``tools[]`` entry: ``computer_20251124`` with the screenshot's size."""
        return _tool_param(self.view, self.enable_zoom)

    async def call(self, input: object) -> Any:
        """Run one ``action`` with its input (see ``ComputerTool20251124.call``)."""
        action, given = _tool_input(input, self.confirm)
        try:
            return _tool_content(action, given, await self.desktop.member(action, given))
        except FleetError as exc:
            raise ToolError(_reason(exc)) from exc


__all__ = [
    "MAX_LONG_SIDE",
    "MAX_PIXELS",
    "AsyncComputerTool20251124",
    "AsyncComputerToolset",
    "ComputerTool20251124",
    "ComputerToolset",
]
