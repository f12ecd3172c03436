"""Actions on a replica, typed and validated before anything reaches the guest.

Pointer and keyboard actions go through QEMU input events; ``shell`` and ``read_file`` through the guest
agent with a timeout. A failed action is an error *result* (the replica stays usable), never an exception
that loses the rest of the step.
"""

from __future__ import annotations

import base64
import contextlib
import math
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator

from osfleet.errors import GuestFileTooLargeError, GuestTimeoutError, OsfleetError
from osfleet.replicas import pyautogui_code
from osfleet.replicas.input import Input, InputError, key_for_char, qcode
from osfleet.replicas.pyautogui_code import CodeFailedError
from osfleet.virt import GuestAgentUnavailableError, Virt
from osfleet.wire import JsonInt, integral

MAX_READ_BYTES = 8 * 2**20
READ_FILE_SECONDS = 60.0  # one guest file read, whatever the guest agent does
READ_CHUNK_BYTES = 1 << 20
AGENT_CALL_SECONDS = 5  # one guest agent call (libvirt's own timeout; a stuck agent answers nothing)
CLOSE_SECONDS = 2
MAX_EMPTY_READS = 3  # empty chunks in a row without an end of file: a broken or hostile guest agent
GUEST_USER = "user"
GUEST_TIMEOUT_SLACK_SECONDS = 5.0
STEP_BUDGET_SECONDS = 90.0  # one step request never takes longer (see run_actions)
KILLED_BY_TIMEOUT = 137  # 128 + SIGKILL, as coreutils timeout -s KILL reports it


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

    x: Coordinate | None = None
    y: Coordinate | None = None

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


def check_actions(actions: list[Action], size: tuple[int, int]) -> None:
    """Refuse a batch that cannot be carried out as given (off-screen, untypable text, unknown key), before
    any of it reaches the guest."""
    w, h = size
    for a in actions:
        points = [(a.x, a.y)] if isinstance(a, Click | DoubleClick | RightClick | Move | Scroll) else []
        if isinstance(a, Drag):
            points = [(a.x1, a.y1), (a.x2, a.y2)]
        for x, y in points:
            if not (0 <= x < w and 0 <= y < h):
                raise InputError(f"{a.type}: coordinates ({x}, {y}) are off the {w}x{h} screen")
        if isinstance(a, TypeText):
            for ch in a.text:
                key_for_char(ch)
        if isinstance(a, Hotkey):
            for k in a.keys:
                qcode(k)
        if isinstance(a, Computer13):
            from osfleet.replicas import computer13  # it builds on this module's models

            computer13.check(a.action, size)


def ends_episode(action: Action) -> bool:
    """The agent says the episode is over: ``terminate``, or OSWorld's ``DONE`` / ``FAIL`` (either space)."""
    if isinstance(action, PyAutoGUI):
        return action.command.strip() in ("DONE", "FAIL")
    if isinstance(action, Computer13):
        return isinstance(action.action, C13Done | C13Fail)
    return isinstance(action, Terminate)


def declares_infeasible(action: Action) -> bool:
    """The agent declares the task infeasible (scored as OSWorld scores it when it is the step's last action):
    ``terminate`` with ``failure``, or OSWorld's ``FAIL``."""
    if isinstance(action, PyAutoGUI):
        return action.command.strip() == "FAIL"
    if isinstance(action, Computer13):
        return isinstance(action.action, C13Fail)
    return isinstance(action, Terminate) and action.status == "failure"


def run_actions(
    virt: Virt, domain: str, size: tuple[int, int], actions: list[Action], budget: float = STEP_BUDGET_SECONDS
) -> list[ActionResult]:
    """Run a batch in order; every action gets a result, failed or not. Invalid batches raise first.

    The whole batch gets ``budget`` seconds: waits and guest-command timeouts are cut to what is left, and
    actions after it are not run (their result says so), so one request never holds a client for longer.
    """
    check_actions(actions, size)
    pointer = Input(virt, domain, size)
    results = []
    deadline = time.monotonic() + budget
    for action in actions:
        start = time.monotonic()
        left = deadline - start
        if left <= 0:
            error = f"not run: the step's {budget:.0f} s budget was used up by the actions before it"
            results.append(ActionResult(type=action.type, ok=False, seconds=0.0, error=error))
            continue
        try:
            extra = _run_one(virt, domain, pointer, _within(action, left), left)
            results.append(ActionResult(type=action.type, ok=True, seconds=time.monotonic() - start, **extra))
        except CodeFailedError as exc:  # the agent's code ran and failed: its error, and what it printed
            took = time.monotonic() - start
            results.append(ActionResult(type=action.type, ok=False, seconds=took, error=str(exc), **exc.output))
        except OsfleetError as exc:
            results.append(ActionResult(type=action.type, ok=False, seconds=time.monotonic() - start, error=str(exc)))
    return results


def _within(action: Action, left: float) -> Action:
    """The action with its wait or guest-command timeout cut to ``left`` seconds."""
    if isinstance(action, Wait) and action.seconds > left:
        return action.model_copy(update={"seconds": left})
    if isinstance(action, Shell | CliCommand | PyAutoGUI) and action.timeout > left:
        return action.model_copy(update={"timeout": max(left, 0.1)})
    return action


def _run_one(virt: Virt, domain: str, pointer: Input, action: Action, left: float) -> dict[str, Any]:
    match action:
        case Click(x=x, y=y, button=button):
            pointer.click(x, y, button)
        case DoubleClick(x=x, y=y):
            pointer.click(x, y, "left", count=2)
        case RightClick(x=x, y=y):
            pointer.click(x, y, "right")
        case Move(x=x, y=y):
            pointer.move(x, y)
        case Drag(x1=x1, y1=y1, x2=x2, y2=y2):
            pointer.drag(x1, y1, x2, y2)
        case Scroll(x=x, y=y, clicks=clicks):
            pointer.scroll(x, y, clicks)
        case TypeText(text=text):
            pointer.type_text(text)
        case Hotkey(keys=keys):
            pointer.hotkey(keys)
        case Wait(seconds=seconds):
            time.sleep(seconds)
        case Shell():
            return shell(virt, domain, action.command, action.timeout, action.as_root)
        case CliCommand():
            return shell(virt, domain, action.command, action.timeout)
        case Terminate():
            pass
        case ReadFile(path=path, max_bytes=max_bytes):
            data = read_file(virt, domain, path, max_bytes, timeout=left)
            return {"content_base64": base64.b64encode(data).decode()}
        case PyAutoGUI(command=command, timeout=timeout):
            special = command.strip()
            if special == "WAIT":
                time.sleep(max(0.0, min(OSWORLD_WAIT_SECONDS, left)))
            elif special not in PYAUTOGUI_SPECIAL:
                return pyautogui_code.run(lambda cmd, t: shell(virt, domain, cmd, t), command, timeout)
        case Computer13():
            from osfleet.replicas import computer13  # it builds on this module's models

            computer13.apply(pointer, action.action, left)
    return {}


def shell(virt: Virt, domain: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
    """Run ``command`` with sh in the guest, as the desktop user on its display unless ``as_root``.

    The guest's own ``timeout -s KILL`` ends the command's whole process group when time is up, so a
    runaway command never leaves the replica busy; the host waits a little longer than that.
    """
    inner = ["/bin/sh", "-c", command]
    if not as_root:
        inner = [
            "/usr/sbin/runuser",
            "-u",
            GUEST_USER,
            "--",
            "/usr/bin/env",
            "DISPLAY=:0",
            f"HOME=/home/{GUEST_USER}",
            "/bin/sh",
            "-c",
            f"cd ~ && {command}",
        ]
    argv = ["/usr/bin/timeout", "-s", "KILL", f"{timeout:.3f}", *inner]
    code, out, err = virt.guest_exec(domain, argv, timeout + GUEST_TIMEOUT_SLACK_SECONDS)
    if code == KILLED_BY_TIMEOUT:
        raise GuestTimeoutError(f"command timed out after {timeout:g} s and was killed")
    return {"exit_code": code, "stdout": out, "stderr": err}


def read_file(
    virt: Virt, domain: str, path: str, max_bytes: int, timeout: float = READ_FILE_SECONDS, whole: bool = False
) -> bytes:
    """The first ``max_bytes`` of a guest file, through the guest agent, within ``timeout`` seconds.

    ``whole``: the file must fit in ``max_bytes``; a larger one raises ``GuestFileTooLargeError`` (a check never
    scores a copy cut short). Without it (the agent's own ``read_file`` action) the first ``max_bytes`` are the
    documented answer. The guest agent belongs to the guest: it may answer late, never, with empty chunks and
    no end of file, or with more than was asked; each of those raises instead of looping or growing.
    """
    deadline = time.monotonic() + timeout

    def call(command: str, arguments: dict[str, Any]) -> Any:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GuestTimeoutError(f"{domain}: reading {path} did not finish within {timeout:.0f} s")
        return virt.agent(domain, command, arguments, timeout=max(1, min(AGENT_CALL_SECONDS, math.ceil(left))))

    handle = call("guest-file-open", {"path": path, "mode": "r"})
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise GuestAgentUnavailableError(f"{domain}: the guest agent opened {path} without a file handle")
    want = max_bytes + 1 if whole else max_bytes
    parts: list[bytes] = []
    got, empty = 0, 0
    try:
        while got < want:
            count = min(READ_CHUNK_BYTES, want - got)
            chunk = call("guest-file-read", {"handle": handle, "count": count})
            encoded = chunk.get("buf-b64", "") if isinstance(chunk, dict) else None
            if not isinstance(encoded, str):
                raise GuestAgentUnavailableError(f"{domain}: the guest agent answered a read of {path} with junk")
            try:  # the length is checked before decoding: a hostile agent's answer is not decoded whole
                data = base64.b64decode(encoded, validate=True) if len(encoded) <= 4 * (count // 3 + 1) else None
            except ValueError:
                raise GuestAgentUnavailableError(f"{domain}: the guest agent sent {path} in broken base64") from None
            if data is None or len(data) > count:
                raise GuestAgentUnavailableError(f"{domain}: the guest agent sent more of {path} than was asked")
            parts.append(data)
            got += len(data)
            if chunk.get("eof"):
                break
            empty = 0 if data else empty + 1
            if empty >= MAX_EMPTY_READS:
                raise GuestAgentUnavailableError(
                    f"{domain}: the guest agent sent no data and no end of file for {path} {empty} times"
                )
    finally:
        with contextlib.suppress(OsfleetError):  # a handle left open is the guest's problem, not the host's
            virt.agent(domain, "guest-file-close", {"handle": handle}, timeout=CLOSE_SECONDS)
    if whole and got > max_bytes:
        raise GuestFileTooLargeError(f"file over {max_bytes / 2**20:g} MiB: {path}")
    return b"".join(parts)
