"""What a step may ask a desktop to do: one model per action, joined as a discriminated union on ``type``.

A whole batch is validated against these before any of it reaches the guest (``ACTIONS``); the host agent runs
them (``osfleet.replicas.actions``) and answers each with an ``ActionResult``. Coordinates are the desktop's
pixels, (0, 0) at the top left.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator
from pydantic.json_schema import SkipJsonSchema

from osfleet.protocol.wire import JsonInt, integral

MAX_READ_BYTES = 8 * 2**20  # the most a read_file action returns


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Click(_Action):
    type: Literal["click"]
    x: JsonInt
    y: JsonInt
    button: Literal["left", "right", "middle"] = "left"


class DoubleClick(_Action):
    type: Literal["double_click"]
    x: JsonInt
    y: JsonInt


class RightClick(_Action):
    type: Literal["right_click"]
    x: JsonInt
    y: JsonInt


class Move(_Action):
    type: Literal["move"]
    x: JsonInt
    y: JsonInt


class Drag(_Action):
    type: Literal["drag"]
    x1: JsonInt
    y1: JsonInt
    x2: JsonInt
    y2: JsonInt


class Scroll(_Action):
    type: Literal["scroll"]
    x: JsonInt
    y: JsonInt
    clicks: JsonInt = Field(description="positive scrolls down, negative up", ge=-50, le=50)


class TypeText(_Action):
    type: Literal["type"]
    text: str = Field(max_length=10000)


class Hotkey(_Action):
    type: Literal["hotkey"]
    keys: list[str] = Field(min_length=1, max_length=6)


class Wait(_Action):
    type: Literal["wait"]
    seconds: float = Field(1.0, ge=0, le=60)


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
    | Drag
    | Scroll
    | TypeText
    | Hotkey
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
