"""What a step may ask a desktop to do: one model per action, joined as a discriminated union on ``type``.

A whole batch is validated against these before any of it reaches the guest (``ACTIONS``); the host agent runs
them (``osfleet.replicas.actions``) and answers each with an ``ActionResult``. Coordinates are the desktop's
pixels, (0, 0) at the top left; a pointer action without ``x``/``y`` acts where the pointer is.

The pointer and keyboard primitives are what the computer-use APIs of 2026 need (Anthropic's computer toolset,
OpenAI's computer actions, E2B's and Cua's desktops): clicks of any button (back and forward too) with a count and
modifier keys held, mouse and key down/up, keys held for a time, scrolls both ways, drags along a path for a time,
Unicode text, the pointer's position (``cursor_position``) and screenshots of a region, scaled as asked
(``screenshot``). A point off the screen, an unknown key or a region outside the screen is refused (422) with the
reason, never clamped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator
from pydantic.json_schema import SkipJsonSchema

from osfleet.protocol.wire import ImageFormat, JsonInt, Quality, integral

MAX_READ_BYTES = 8 * 2**20  # the most a read_file action returns
MAX_MODIFIERS = 6  # keys held during one pointer action
MAX_PATH_POINTS = 200  # points of one drag's path
MAX_DRAG_SECONDS = 30.0  # how long one drag's movement may take
MAX_HOLD_SECONDS = 60.0  # how long hold_key holds
MAX_IMAGE_SIDE = 4096  # pixels of a screenshot action's image on either side (its memory is bounded)
MAX_WHEEL_CLICKS = 50  # wheel clicks of one scroll, each way


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


OptionalPixel = JsonInt | SkipJsonSchema[None]
PointerButton = Literal["left", "right", "middle", "back", "forward"]
Key = Annotated[
    str,
    Field(
        min_length=1,
        max_length=40,
        description="a key by name, case-insensitive: osfleet's (ctrl, shift, enter, f5, a), pyautogui's (ctrlleft), "
        "X's (Return, Page_Down, KP_Enter) or a browser's (ArrowLeft, Escape)",
    ),
]
Modifiers = Annotated[
    list[Key],
    Field(max_length=MAX_MODIFIERS, description='keys held down during the action, e.g. ["ctrl", "shift"]'),
]


class _AtPointer(_Action):
    """``x`` and ``y``, or neither: where the pointer is."""

    # The schema says it too (no null, each needs the other), so a body valid by the schema is one this takes.
    model_config = ConfigDict(json_schema_extra={"dependentRequired": {"x": ["y"], "y": ["x"]}})

    x: OptionalPixel = Field(None, description="pixels from the left edge; omitted (with y): where the pointer is")
    y: OptionalPixel = Field(None, description="pixels from the top edge; omitted (with x): where the pointer is")

    @model_validator(mode="after")
    def _both_or_neither(self) -> Any:
        if (self.x is None) != (self.y is None):
            raise ValueError("give both x and y, or neither (where the pointer is)")
        return self

    @property
    def point(self) -> tuple[int, int] | None:
        return None if self.x is None or self.y is None else (self.x, self.y)


class Click(_AtPointer):
    type: Literal["click"]
    button: PointerButton = "left"
    count: Annotated[
        int, Field(ge=1, le=3, description="1, 2 (double) or 3 (triple) clicks"), BeforeValidator(integral)
    ] = 1
    keys: Modifiers = Field(default_factory=list)


class DoubleClick(_AtPointer):
    type: Literal["double_click"]
    keys: Modifiers = Field(default_factory=list)


class RightClick(_AtPointer):
    type: Literal["right_click"]
    keys: Modifiers = Field(default_factory=list)


class Move(_Action):
    type: Literal["move"]
    x: JsonInt
    y: JsonInt
    keys: Modifiers = Field(default_factory=list)


class MouseDown(_AtPointer):
    """Press a mouse button (moving there first when ``x``/``y`` are given) and keep it down."""

    type: Literal["mouse_down"]
    button: PointerButton = "left"


class MouseUp(_AtPointer):
    """Release a mouse button (moving there first when ``x``/``y`` are given)."""

    type: Literal["mouse_up"]
    button: PointerButton = "left"


PathPoint = Annotated[list[JsonInt], Field(min_length=2, max_length=2, description="[x, y]")]


class Drag(_Action):
    """Press ``button`` at the first point, move through the others, release at the last: from (x1, y1) to
    (x2, y2), or along ``path``; the movement takes ``seconds`` (0: osfleet's quick default)."""

    # The schema says it too: the four corners go together, or a path instead (one of them).
    model_config = ConfigDict(
        json_schema_extra={
            "dependentRequired": {"x1": ["y1", "x2", "y2"], "y1": ["x1"], "x2": ["x1"], "y2": ["x1"]},
            "oneOf": [{"required": ["x1", "y1", "x2", "y2"]}, {"required": ["path"]}],
        }
    )

    type: Literal["drag"]
    x1: OptionalPixel = None
    y1: OptionalPixel = None
    x2: OptionalPixel = None
    y2: OptionalPixel = None
    path: Annotated[list[PathPoint], Field(min_length=2, max_length=MAX_PATH_POINTS)] | SkipJsonSchema[None] = Field(
        None, description="the points to drag through, [[x, y], ...]"
    )
    seconds: float = Field(0.0, ge=0, le=MAX_DRAG_SECONDS, description="how long the movement takes")
    button: Literal["left", "right", "middle"] = "left"
    keys: Modifiers = Field(default_factory=list)

    @model_validator(mode="after")
    def _corners_or_path(self) -> Drag:
        corners = [self.x1, self.y1, self.x2, self.y2]
        if self.path is None and any(c is None for c in corners):
            raise ValueError("give x1, y1, x2 and y2, or a path")
        if self.path is not None and any(c is not None for c in corners):
            raise ValueError("give x1, y1, x2 and y2, or a path, not both")
        return self

    @property
    def points(self) -> list[tuple[int, int]]:
        if self.path is not None:
            return [(p[0], p[1]) for p in self.path]
        assert self.x1 is not None and self.y1 is not None and self.x2 is not None and self.y2 is not None
        return [(self.x1, self.y1), (self.x2, self.y2)]


WheelClicks = Annotated[int, Field(ge=-MAX_WHEEL_CLICKS, le=MAX_WHEEL_CLICKS), BeforeValidator(integral)]


class Scroll(_AtPointer):
    type: Literal["scroll"]
    clicks: WheelClicks = Field(0, description="wheel clicks: positive scrolls down, negative up")
    clicks_x: WheelClicks = Field(0, description="horizontal wheel clicks: positive scrolls right, negative left")
    keys: Modifiers = Field(default_factory=list)


class TypeText(_Action):
    """Type ``text`` into the focused window: any Unicode text but control characters ("\\n" presses Enter,
    "\\t" Tab). What the guest's US keyboard has is typed as its keys; any other character through a spare key
    the guest's X server maps to it for the while (``osfleet.replicas.unicode_keys``)."""

    type: Literal["type"]
    text: str = Field(max_length=10000)


class Hotkey(_Action):
    type: Literal["hotkey"]
    keys: list[str] = Field(min_length=1, max_length=6)


class KeyDown(_Action):
    """Press a key and keep it down (until a ``key_up`` of it)."""

    type: Literal["key_down"]
    key: Key


class KeyUp(_Action):
    type: Literal["key_up"]
    key: Key


class HoldKey(_Action):
    """Hold ``keys`` down together for ``seconds``, then release them in reverse order."""

    type: Literal["hold_key"]
    keys: list[Key] = Field(min_length=1, max_length=MAX_MODIFIERS)
    seconds: float = Field(ge=0, le=MAX_HOLD_SECONDS)


class CursorPosition(_Action):
    """Where the pointer is: answered in the result's ``x`` and ``y``."""

    type: Literal["cursor_position"]


Region = Annotated[
    list[JsonInt],
    Field(
        min_length=4,
        max_length=4,
        description="[x0, y0, x1, y1]: the screen's pixels x0 <= x < x1, y0 <= y < y1 (inside the screen)",
    ),
]
ImageSide = Annotated[int, Field(ge=1, le=MAX_IMAGE_SIDE), BeforeValidator(integral)]


class Screenshot(_Action):
    """The screen, or a ``region`` of it, as an image in the result (``content_base64``, ``width``, ``height``),
    scaled to ``width`` x ``height`` when asked (one of them given: the other keeps the aspect ratio)."""

    type: Literal["screenshot"]
    region: Region | SkipJsonSchema[None] = None
    width: ImageSide | SkipJsonSchema[None] = Field(None, description="the image's width in pixels")
    height: ImageSide | SkipJsonSchema[None] = Field(None, description="the image's height in pixels")
    format: ImageFormat = "png"
    quality: Quality | SkipJsonSchema[None] = Field(None, description="JPEG/WebP quality; ignored for png")


class Wait(_Action):
    """Wait ``seconds``; with ``until: "quiet"``, only until the screen has not changed for ``quiet_seconds``, and
    ``seconds`` at the longest (its result's ``seconds`` says how long it waited: the bound when the screen never
    settled). An agent waits as long as the desktop draws instead of a fixed sleep (``osfleet.replicas.settle``)."""

    type: Literal["wait"]
    seconds: float = Field(1.0, ge=0, le=60, description="how long to wait; with until=quiet, the longest")
    until: Literal["quiet"] | None = Field(None, description="quiet: end once the screen stops changing")
    quiet_seconds: float = Field(
        0.5, gt=0, le=10, description="with until=quiet: how long the screen must stay unchanged"
    )


class Shell(_Action):
    type: Literal["shell"]
    command: str = Field(min_length=1, max_length=100000)
    timeout: float = Field(30.0, gt=0, le=600)
    as_root: bool = False


class CliCommand(_Action):
    """A shell command as the desktop user (the name OSGym and MAI-Gym style agents use)."""

    type: Literal["cli_command"]
    command: str = Field(min_length=1, max_length=100000)
    timeout: float = Field(30.0, gt=0, le=600)


class Terminate(_Action):
    """The agent declares the episode over; nothing happens in the guest."""

    type: Literal["terminate"]
    status: Literal["success", "failure"] = "success"


class ReadFile(_Action):
    type: Literal["read_file"]
    path: str = Field(pattern=r"^/[^\x00]*$", max_length=4096)
    max_bytes: JsonInt = Field(1 << 20, gt=0, le=MAX_READ_BYTES)


PYAUTOGUI_SPECIAL = ("WAIT", "DONE", "FAIL")  # OSWorld's step strings that are not code
OSWORLD_WAIT_SECONDS = 1.0  # what WAIT waits, here as in osfleet's OSGym action strings


class PyAutoGUI(_Action):
    """OSWorld's ``pyautogui`` action space: Python run in the guest as OSWorld runs it (``pyautogui`` and ``time``
    imported, ``FAILSAFE`` off), as the desktop user on its display; or ``WAIT``, ``DONE``, ``FAIL`` (the agent
    declares the task infeasible; the episode ends)."""

    type: Literal["pyautogui"]
    command: str = Field(min_length=1, max_length=100000, description="Python code, or WAIT, DONE or FAIL")
    timeout: float = Field(60.0, gt=0, le=600, description="seconds the code may run (cut to the step's budget)")


class _C13(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Coordinate = Annotated[float, Field(ge=0, le=100000, description="screen pixels from the left or top edge")]
MouseButton = Literal["left", "right", "middle"]
KeyName = Annotated[str, Field(min_length=1, max_length=40, description="a pyautogui key name or one character")]


class C13Position(_C13):
    """Where to act: both ``x`` and ``y``, or neither (where the pointer is)."""

    # The schema says it too (no null, each needs the other), so a body valid by the schema is one this takes.
    model_config = ConfigDict(json_schema_extra={"dependentRequired": {"x": ["y"], "y": ["x"]}})

    x: Coordinate | SkipJsonSchema[None] = None
    y: Coordinate | SkipJsonSchema[None] = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> C13Position:
        if (self.x is None) != (self.y is None):
            raise ValueError("give both x and y, or neither (where the pointer is)")
        return self


class C13Point(_C13):
    x: Coordinate
    y: Coordinate


class C13ClickParams(C13Position):
    button: MouseButton = "left"
    num_clicks: Annotated[int, Field(ge=1, le=3), BeforeValidator(integral)] = 1


class C13ButtonParams(_C13):
    button: MouseButton = "left"


class C13ScrollParams(_C13):
    dx: Annotated[int, Field(ge=-50, le=50), BeforeValidator(integral)] = 0
    dy: Annotated[int, Field(ge=-50, le=50), BeforeValidator(integral)] = 0


class C13TextParams(_C13):
    text: str = Field(max_length=10000)


class C13KeyParams(_C13):
    key: KeyName


class C13KeysParams(_C13):
    keys: list[KeyName] = Field(min_length=1, max_length=8)


class C13NoParams(_C13):
    pass


def _flat_parameters(value: Any) -> Any:
    """OSWorld's own forms too: ``"WAIT"`` for ``{"action_type": "WAIT"}``, and parameters beside
    ``action_type`` when there is no ``parameters`` key (OSWorld's controller takes both)."""
    if isinstance(value, str) and value in PYAUTOGUI_SPECIAL:
        return {"action_type": value}
    if isinstance(value, dict) and "parameters" not in value and len(value) > 1:
        rest = {k: v for k, v in value.items() if k != "action_type"}
        return {"action_type": value.get("action_type"), "parameters": rest}
    return value


class C13MoveTo(_C13):
    action_type: Literal["MOVE_TO"]
    parameters: C13Point


class C13Click(_C13):
    action_type: Literal["CLICK"]
    parameters: C13ClickParams = Field(default_factory=C13ClickParams)


class C13MouseDown(_C13):
    action_type: Literal["MOUSE_DOWN"]
    parameters: C13ButtonParams = Field(default_factory=C13ButtonParams)


class C13MouseUp(_C13):
    action_type: Literal["MOUSE_UP"]
    parameters: C13ButtonParams = Field(default_factory=C13ButtonParams)


class C13RightClick(_C13):
    action_type: Literal["RIGHT_CLICK"]
    parameters: C13Position = Field(default_factory=C13Position)


class C13DoubleClick(_C13):
    action_type: Literal["DOUBLE_CLICK"]
    parameters: C13Position = Field(default_factory=C13Position)


class C13DragTo(_C13):
    action_type: Literal["DRAG_TO"]
    parameters: C13Point


class C13Scroll(_C13):
    action_type: Literal["SCROLL"]
    parameters: C13ScrollParams


class C13Typing(_C13):
    action_type: Literal["TYPING"]
    parameters: C13TextParams


class C13Press(_C13):
    action_type: Literal["PRESS"]
    parameters: C13KeyParams


class C13KeyDown(_C13):
    action_type: Literal["KEY_DOWN"]
    parameters: C13KeyParams


class C13KeyUp(_C13):
    action_type: Literal["KEY_UP"]
    parameters: C13KeyParams


class C13Hotkey(_C13):
    action_type: Literal["HOTKEY"]
    parameters: C13KeysParams


class C13Wait(_C13):
    action_type: Literal["WAIT"]
    parameters: C13NoParams = Field(default_factory=C13NoParams)


class C13Fail(_C13):
    action_type: Literal["FAIL"]
    parameters: C13NoParams = Field(default_factory=C13NoParams)


class C13Done(_C13):
    action_type: Literal["DONE"]
    parameters: C13NoParams = Field(default_factory=C13NoParams)


Computer13Action = Annotated[
    C13MoveTo
    | C13Click
    | C13MouseDown
    | C13MouseUp
    | C13RightClick
    | C13DoubleClick
    | C13DragTo
    | C13Scroll
    | C13Typing
    | C13Press
    | C13KeyDown
    | C13KeyUp
    | C13Hotkey
    | C13Wait
    | C13Fail
    | C13Done,
    Field(discriminator="action_type"),
    BeforeValidator(_flat_parameters),
]


class Computer13(_Action):
    """OSWorld's ``computer_13`` action space: one of its 16 actions (MOVE_TO, CLICK, MOUSE_DOWN, MOUSE_UP,
    RIGHT_CLICK, DOUBLE_CLICK, DRAG_TO, SCROLL, TYPING, PRESS, KEY_DOWN, KEY_UP, HOTKEY, WAIT, FAIL, DONE), sent
    as QEMU input events like osfleet's own. Without ``x``/``y`` a click happens where the pointer is."""

    type: Literal["computer_13"]
    action: Computer13Action


Action = Annotated[
    Click
    | DoubleClick
    | RightClick
    | Move
    | MouseDown
    | MouseUp
    | Drag
    | Scroll
    | TypeText
    | Hotkey
    | KeyDown
    | KeyUp
    | HoldKey
    | CursorPosition
    | Screenshot
    | Wait
    | Shell
    | CliCommand
    | Terminate
    | ReadFile
    | PyAutoGUI
    | Computer13,
    Field(discriminator="type"),
]
ACTIONS: TypeAdapter[list[Action]] = TypeAdapter(list[Action])


class ActionResult(BaseModel):
    type: str
    ok: bool
    seconds: float
    error: str | None = None
    exit_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    content_base64: str | None = None
    x: int | None = Field(None, description="cursor_position: the pointer's x")
    y: int | None = Field(None, description="cursor_position: the pointer's y")
    width: int | None = Field(None, description="screenshot: the image's width")
    height: int | None = Field(None, description="screenshot: the image's height")
