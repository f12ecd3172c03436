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
from collections.abc import Callable
from typing import Any

from PIL import Image

from osfleet.errors import GuestCommandKilledError, GuestFileTooLargeError, GuestTimeoutError, OsfleetError
from osfleet.protocol.actions import (
    MAX_IMAGE_SIDE,
    OSWORLD_WAIT_SECONDS,
    PYAUTOGUI_SPECIAL,
    Action,
    ActionResult,
    C13Done,
    C13Fail,
    Click,
    CliCommand,
    Computer13,
    CursorPosition,
    DoubleClick,
    Drag,
    HoldKey,
    Hotkey,
    KeyDown,
    KeyUp,
    MouseDown,
    MouseUp,
    Move,
    PyAutoGUI,
    ReadFile,
    RightClick,
    Screenshot,
    Scroll,
    Shell,
    Terminate,
    TypeText,
    Wait,
)
from osfleet.protocol.osworld_paths import GUEST_USER
from osfleet.replicas import computer13, pyautogui_code, settle
from osfleet.replicas.input import Input, InputError, check_point, check_text, combo, combo_key
from osfleet.replicas.pyautogui_code import CodeFailedError
from osfleet.vm import screen
from osfleet.vm.virt import GuestAgentUnavailableError, Virt

Capture = Callable[[], Image.Image]
"""The replica's screen now (``capture.ScreenCapture.grab`` of its domain)."""

READ_FILE_SECONDS = 60.0  # one guest file read, whatever the guest agent does
READ_CHUNK_BYTES = 1 << 20
AGENT_CALL_SECONDS = 5  # one guest agent call (libvirt's own timeout; a stuck agent answers nothing)
CLOSE_SECONDS = 2
MAX_EMPTY_READS = 3  # empty chunks in a row without an end of file: a broken or hostile guest agent
GUEST_TIMEOUT_SLACK_SECONDS = 5.0
STEP_BUDGET_SECONDS = 90.0  # one step request never takes longer (see run_actions)
KILLED_BY_TIMEOUT = 137  # 128 + SIGKILL, as coreutils timeout -s KILL reports it
# The whole environment of a command osfleet runs as the desktop user for a task (set-up steps, getters, the query
# script): fixed, so nothing the agent (the desktop user) writes is read while its work is judged. No PATH entry
# in the user's home (a fake ``python3`` or ``google-chrome`` in ~/.local/bin or ~/bin is never found), no user
# site-packages (their ``.pth`` files and ``sitecustomize``), and no working folder first on ``sys.path`` for a
# ``python -c``/``-m`` (a ``~/json.py``): Python 3.11's PYTHONSAFEPATH. The agent's own ``shell``, ``cli`` and
# ``pyautogui`` actions keep the user's ways (they are the agent's).
VERIFIER_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"HOME=/home/{GUEST_USER}",
    f"USER={GUEST_USER}",
    f"LOGNAME={GUEST_USER}",
    "DISPLAY=:0",
    "PYTHONSAFEPATH=1",
    "PYTHONNOUSERSITE=1",
    "PYTHONDONTWRITEBYTECODE=1",
)


def check_actions(actions: list[Action], size: tuple[int, int]) -> None:
    """Refuse a batch that cannot be carried out as given (off-screen, untypable text, unknown key, a region
    outside the screen), before any of it reaches the guest: ``InputError`` (a 422 with the reason)."""
    for a in actions:
        points: list[tuple[int, int]] = []
        if isinstance(a, Click | DoubleClick | RightClick | MouseDown | MouseUp | Scroll) and a.point is not None:
            points = [a.point]
        if isinstance(a, Move):
            points = [(a.x, a.y)]
        if isinstance(a, Drag):
            points = a.points
        for x, y in points:
            check_point(x, y, size, f"{a.type}: ")
        if isinstance(a, Click | DoubleClick | RightClick | Move | Drag | Scroll | Hotkey | HoldKey):
            combo(a.keys)
        if isinstance(a, KeyDown | KeyUp):
            combo_key(a.key)
        if isinstance(a, TypeText):
            check_text(a.text)
        if isinstance(a, Screenshot):
            shot_size(a, size)
        if isinstance(a, Computer13):
            computer13.check(a.action, size)


def shot_size(shot: Screenshot, size: tuple[int, int]) -> tuple[tuple[int, int, int, int], tuple[int, int]]:
    """The region a ``screenshot`` action takes (x0, y0, x1, y1) and the size of its image: as asked, or the
    region's own; one side asked, the other keeps the aspect ratio. A region outside the screen, or an image
    that would be too small or too big, is refused."""
    w, h = size
    x0, y0, x1, y1 = shot.region if shot.region is not None else (0, 0, w, h)
    if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
        raise InputError(
            f"screenshot: region [{x0}, {y0}, {x1}, {y1}] is not inside the {w}x{h} screen "
            f"(0 <= x0 < x1 <= {w}, 0 <= y0 < y1 <= {h})"
        )
    rw, rh = x1 - x0, y1 - y0
    if shot.width is not None and shot.height is not None:
        out = (shot.width, shot.height)
    elif shot.width is not None:
        out = (shot.width, round(rh * shot.width / rw))
    elif shot.height is not None:
        out = (round(rw * shot.height / rh), shot.height)
    else:
        out = (rw, rh)
    if not all(1 <= side <= MAX_IMAGE_SIDE for side in out):
        raise InputError(f"screenshot: a {out[0]}x{out[1]} image is not between 1 and {MAX_IMAGE_SIDE} pixels a side")
    return (x0, y0, x1, y1), out


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
    virt: Virt,
    domain: str,
    size: tuple[int, int],
    actions: list[Action],
    budget: float = STEP_BUDGET_SECONDS,
    capture: Capture | None = None,
    screen_state: settle.Fingerprint | None = None,
) -> list[ActionResult]:
    """Run a batch in order; every action gets a result, failed or not. Invalid batches raise first.

    The whole batch gets ``budget`` seconds: waits and guest-command timeouts are cut to what is left, and
    actions after it are not run (their result says so), so one request never holds a client for longer.
    ``capture`` takes the screen for ``screenshot`` actions (without it they fail); ``screen_state`` tells whether
    it changed, for ``wait`` until quiet (``osfleet.replicas.settle``; without it such a wait fails).
    """
    check_actions(actions, size)
    pointer = Input(virt, domain, size, guest=lambda command, timeout: shell(virt, domain, command, timeout))
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
            extra = _run_one(virt, domain, pointer, _within(action, left), left, capture, screen_state)
            results.append(ActionResult(type=action.type, ok=True, seconds=time.monotonic() - start, **extra))
        except CodeFailedError as exc:  # the agent's code ran and failed: its error, and what it printed
            took = time.monotonic() - start
            results.append(ActionResult(type=action.type, ok=False, seconds=took, error=str(exc), **exc.output))
        except OsfleetError as exc:
            results.append(ActionResult(type=action.type, ok=False, seconds=time.monotonic() - start, error=str(exc)))
        finally:
            if isinstance(action, Shell | CliCommand | PyAutoGUI):
                pointer.forget_position()  # the agent's own code may have moved it
    return results


def _within(action: Action, left: float) -> Action:
    """The action with its wait, hold, drag or guest-command timeout cut to ``left`` seconds."""
    if isinstance(action, Wait | HoldKey | Drag) and action.seconds > left:
        return action.model_copy(update={"seconds": left})
    if isinstance(action, Shell | CliCommand | PyAutoGUI) and action.timeout > left:
        return action.model_copy(update={"timeout": max(left, 0.1)})
    return action


def _run_one(
    virt: Virt,
    domain: str,
    pointer: Input,
    action: Action,
    left: float,
    capture: Capture | None,
    screen_state: settle.Fingerprint | None = None,
) -> dict[str, Any]:
    match action:
        case Click(x=x, y=y, button=button, count=count, keys=keys):
            pointer.click(x, y, button, count, keys)
        case DoubleClick(x=x, y=y, keys=keys):
            pointer.click(x, y, "left", 2, keys)
        case RightClick(x=x, y=y, keys=keys):
            pointer.click(x, y, "right", 1, keys)
        case Move(x=x, y=y, keys=keys):
            with pointer.holding(keys):
                pointer.move(x, y)
        case MouseDown(x=x, y=y, button=button) | MouseUp(x=x, y=y, button=button):
            if x is not None and y is not None:
                pointer.move(x, y)
            pointer.button(button, isinstance(action, MouseDown))
        case Drag(seconds=seconds, button=button, keys=keys):
            pointer.drag_path(action.points, seconds, button, keys)
        case Scroll(x=x, y=y, clicks=clicks, clicks_x=clicks_x, keys=keys):
            pointer.scroll(x, y, clicks, clicks_x, keys)
        case TypeText(text=text):
            pointer.type_text(text)
        case Hotkey(keys=keys):
            pointer.hotkey(keys)
        case KeyDown(key=key) | KeyUp(key=key):
            pointer.key_by_name(key, isinstance(action, KeyDown))
        case HoldKey(keys=keys, seconds=seconds):
            pointer.hold(keys, seconds)
        case CursorPosition():
            x, y = pointer.position()
            return {"x": x, "y": y}
        case Screenshot():
            return _screenshot(action, pointer.size, capture)
        case Wait(until="quiet", seconds=seconds, quiet_seconds=quiet):
            if screen_state is None:
                raise OsfleetError("wait until quiet: this replica's screen cannot be watched here")
            settle.wait_until_quiet(screen_state, seconds, quiet)
        case Wait(seconds=seconds):
            time.sleep(seconds)
        case Shell():
            return shell(virt, domain, action.command, action.timeout, action.as_root, agent=True)
        case CliCommand():
            return shell(virt, domain, action.command, action.timeout, agent=True)
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
                return pyautogui_code.run(lambda cmd, t: shell(virt, domain, cmd, t, agent=True), command, timeout)
        case Computer13():
            computer13.apply(pointer, action.action, left)
    return {}


def _screenshot(shot: Screenshot, size: tuple[int, int], capture: Capture | None) -> dict[str, Any]:
    """The screen (or its region), scaled and encoded as the action asks."""
    if capture is None:
        raise OsfleetError("screenshot: this host cannot take the screen inside a step")
    region, out = shot_size(shot, size)
    image = capture()
    if image.size != size:  # the guest changed its mode: the checked region may not be where the agent thinks
        raise OsfleetError(f"screenshot: the screen is {image.width}x{image.height}, not {size[0]}x{size[1]}")
    if region != (0, 0, *size):
        image = image.crop(region)
    if out != image.size:
        image = image.resize(out, Image.Resampling.LANCZOS)
    data = screen.encode(image, shot.format, shot.quality)
    return {"content_base64": base64.b64encode(data).decode(), "width": out[0], "height": out[1]}


def shell(
    virt: Virt, domain: str, command: str, timeout: float, as_root: bool = False, agent: bool = False
) -> dict[str, Any]:
    """Run ``command`` with sh in the guest, as the desktop user on its display unless ``as_root``.

    ``agent``: the agent's own command, in the user's home with the user's ways; otherwise osfleet's (a task's
    set-up or getter), in the home folder as OSWorld runs them but with ``VERIFIER_ENV`` and nothing else.
    The guest's own ``timeout -s KILL`` ends the command's whole process group when time is up, so a
    runaway command never leaves the replica busy; the host waits a little longer than that.
    """
    inner = ["/bin/sh", "-c", command]
    if not as_root and agent:
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
    elif not as_root:
        inner = ["/usr/sbin/runuser", "-u", GUEST_USER, "--", "/usr/bin/env", "-i", *VERIFIER_ENV]
        inner += ["/bin/sh", "-c", f"cd ~ && {command}"]
    argv = ["/usr/bin/timeout", "-s", "KILL", f"{timeout:.3f}", *inner]
    code, out, err = virt.guest_exec(domain, argv, timeout + GUEST_TIMEOUT_SLACK_SECONDS)
    if code == KILLED_BY_TIMEOUT:
        raise GuestCommandKilledError(f"command timed out after {timeout:g} s and was killed")
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
