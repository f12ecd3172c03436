"""OSWorld's in-VM server protocol, endpoint by endpoint, answered with osfleet client SDK calls.

Every endpoint reads its request as OSWorld's controllers send it (``desktop_env/controllers/python.py`` and
``setup.py`` of desktop-env 1.0.2) and answers with the fields they read, in the shapes OSWorld's server
(``desktop_env/server/main.py``) gives; the wording of messages is ours (nothing reads it). The work is done by a
``Desktop``: the four session methods of ``osfleet.client.Session`` this module uses (``step``, ``observe``,
``upload``, ``download``), so the tests run every endpoint against a fake of them.

How each is served (the package's docstring has the differences that remain):

- commands (``/execute``, ``/setup/execute``, ``/setup/launch``, ``/run_python``, ``/run_bash_script``, the
  window and wallpaper set-up steps, ``/platform``, ``/cursor_position``, ``/window_size``): one ``step`` with
  osfleet's ``shell`` action as the desktop user (``commands`` has the command lines), or its ``pyautogui``
  action for an agent's action in OSWorld's own form;
- the screen (``/screenshot`` with the pointer drawn in, ``/accessibility``, ``/terminal``, ``/screen_size``):
  ``observe`` with ``include``; when only a part is wanted the screenshot that always comes with it is asked for
  as the smallest JPEG (quality 1), and dropped;
- files (``/file``, ``/setup/upload``, ``/wallpaper``): ``download``/``upload``, which reach the desktop user's
  home and /tmp only;
- ``/list_directory``: osfleet's own guest query script (``osfleet.tasks.osworld_format.guest_query``, op
  ``list_directory``), sent through a ``shell`` step.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from osfleet.client import Screen, StepResult
from osfleet.osworld import commands
from osfleet.osworld.bodies import MAX_JSON_BYTES, MAX_UPLOAD_BYTES, form, json_object
from osfleet.osworld.errors import (
    HANDLED,
    BadRequest,
    FileRefused,
    GuestFailed,
    MethodNotAllowed,
    NotSupported,
    NotThere,
    status_of,
)
from osfleet.osworld.recording import ScreenRecorder
from osfleet.protocol.models import FILE_ROOTS, ImageFormat, ObservationPart
from osfleet.protocol.osworld_paths import GUEST_HOME, command_line, guest_path, truthy
from osfleet.tasks.osworld_format import guest_query
from osfleet.tasks.osworld_format.guest_query import GuestQueryError

log = logging.getLogger(__name__)

EXECUTE_SECONDS = 120.0  # OSWorld's subprocess timeout for /execute (a host cuts a step to its own 90 s budget)
LAUNCH_SECONDS = 30.0  # starting a detached program
RUN_PYTHON_SECONDS = 30.0  # OSWorld's /run_python timeout
BASH_DEFAULT_SECONDS = 100.0  # OSWorld's /run_bash_script default when the request names none
QUERY_SECONDS = 30.0  # a small guest command (uname, gsettings, xdotool, a query script)
CHROME_ASK_SECONDS = 10.0  # the running browser's tab count (none answering: no browser to wait for)
CHROME_LANDING_SECONDS = 45.0  # a launch handed to the running browser becomes its window (TCG: ~5-20 s)
OPEN_FILE_SECONDS = 1800.0  # OSWorld's wait for the window of an opened file (its controller waits 1810 s)
OPEN_POLL_SECONDS = 60.0  # one guest command of that wait (a step never lasts longer than the host's budget)
VERIFY_MAX_SECONDS = 75.0  # the longest verification wait one step holds (within a host's 90 s step budget)
MAX_SHELL_SECONDS = 600.0  # the most osfleet's shell action takes (osfleet.protocol.actions.Shell)
SMALLEST: dict[str, Any] = {"format": "jpeg", "quality": 1}  # the screenshot nobody looks at


class Desktop(Protocol):
    """What the endpoints need of a leased replica: a subset of ``osfleet.client.Session``."""

    @property
    def replica_id(self) -> str: ...

    def step(self, actions: Sequence[dict[str, Any]], **options: Any) -> StepResult: ...

    def observe(
        self,
        *,
        format: ImageFormat | None = None,
        quality: int | None = None,
        include: Sequence[ObservationPart] = (),
        timeout: float | None = None,
    ) -> Screen: ...

    def upload(self, path: str, data: bytes, *, timeout: float | None = None) -> int: ...

    def download(self, path: str, *, timeout: float | None = None) -> bytes: ...


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str
    body: bytes


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Answer:
        return cls(status, json.dumps(value).encode(), "application/json")

    @classmethod
    def text(cls, text: str, status: int = 200) -> Answer:
        return cls(status, text.encode(), "text/html; charset=utf-8")  # what Flask sends for a returned str

    @classmethod
    def data(cls, data: bytes, content_type: str) -> Answer:
        return cls(200, data, content_type)


class ErrorShape(Enum):
    """How an endpoint's error looks in OSWorld's server (the body its controller may read on a failure)."""

    STATUS_MESSAGE = "status_message"  # {"status": "error", "message": ...}
    ERROR = "error"  # {"error": ...}
    TEXT = "text"  # the message as text
    RUN_PYTHON = "run_python"  # /run_python's: its controller reads "error" from any non-200 answer
    BASH = "bash"  # /run_bash_script's: {"status", "output", "error": "", "returncode": -1}

    def answer(self, status: int, message: str) -> Answer:
        if self is ErrorShape.STATUS_MESSAGE:
            return Answer.json({"status": "error", "message": message}, status)
        if self is ErrorShape.ERROR:
            return Answer.json({"error": message}, status)
        if self is ErrorShape.RUN_PYTHON:
            body = {"status": "error", "message": message, "error": message, "need_more": False, "output": None}
            return Answer.json(body, status)
        if self is ErrorShape.BASH:
            return Answer.json({"status": "error", "output": message, "error": "", "returncode": -1}, status)
        return Answer.text(message, status)


@dataclass(frozen=True)
class Ran:
    """A guest command that ran to its end (a command that did not is ``GuestFailed``)."""

    exit_code: int
    stdout: str
    stderr: str

    def last_line(self) -> str:
        lines = [x for x in (self.stderr or self.stdout).strip().splitlines() if x.strip()]
        return lines[-1] if lines else f"exit status {self.exit_code}"


class _StepShell:
    """``osfleet.tasks.osworld_format.guest_query``'s host interface (``shell(rid, command, timeout)``) over shell
    steps."""

    def __init__(self, endpoints: Endpoints, what: str) -> None:
        self._endpoints, self._what = endpoints, what

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        del replica_id, as_root  # the session's own replica; a client's shell is the desktop user's
        ran = self._endpoints.shell(command, timeout, self._what)
        return {"exit_code": ran.exit_code, "stdout": ran.stdout, "stderr": ran.stderr}


def _clamp(seconds: float) -> float:
    return min(max(seconds, 0.1), MAX_SHELL_SECONDS)


def _string(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise BadRequest(f"{key!r} must be a string, not {type(value).__name__}")


def _seconds(data: dict[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key!r} must be a number of seconds")
    return float(value)


def _command(data: dict[str, Any]) -> tuple[str | list[str], bool]:
    """``command`` and ``shell`` as OSWorld's server reads them (a missing command is empty)."""
    shell = truthy(data.get("shell", False))
    command = data.get("command", "" if shell else [])
    if isinstance(command, str) or (isinstance(command, list) and all(isinstance(c, str) for c in command)):
        if not command:
            raise GuestFailed("the command is empty")  # OSWorld's subprocess raises for it: 500
        return command, shell
    raise BadRequest("'command' must be a string or a list of strings")


def _line(command: str | list[str], shell: bool) -> str:
    try:
        return command_line(command, shell)
    except ValueError as exc:  # shlex cannot split it (an open quote): OSWorld's server fails on it too
        raise GuestFailed(f"cannot split the command into arguments: {exc}") from None


def _within_file_roots(path: str) -> str:
    """``path`` (OSWorld's ``expanduser``/``expandvars`` done) made normal, when osfleet's file transfer reaches
    it: under the desktop user's home or /tmp."""
    norm = posixpath.normpath(guest_path(path))
    if not any(norm.startswith(root) for root in FILE_ROOTS):
        roots = " and ".join(FILE_ROOTS)
        raise FileRefused(f"{norm}: osfleet moves files under {roots} only")
    return norm


class Endpoints:
    """The endpoints of one leased desktop (see the module's docstring); ``handle`` answers one request."""

    def __init__(self, desktop: Desktop, clock: Callable[[], float] = time.monotonic) -> None:
        self.desktop = desktop
        self._clock = clock
        self.recorder = ScreenRecorder(desktop)

    def handle(self, route: Route, request: Request) -> Answer:
        """``route``'s answer to ``request``; an error it raises answered in the route's error shape."""
        try:
            return route.handler(self, request)
        except HANDLED as exc:
            status = status_of(exc)
            log.info("%s %s -> %d: %s", request.method, request.path, status, exc)
            return route.errors.answer(status, str(exc))

    # --- running things in the guest ----------------------------------------------------------------------------
    def run(self, action: dict[str, Any], what: str) -> Ran:
        """One action as one step; its result when the command ran to its end, else ``GuestFailed``."""
        result = self.desktop.step([action], observe=False, metadata={"osworld_endpoint": what})
        outcome = result.results[0]
        if outcome.exit_code is None:
            raise GuestFailed(f"{what}: {outcome.error or 'the guest did not run the command'}")
        return Ran(outcome.exit_code, outcome.stdout or "", outcome.stderr or "")

    def shell(self, command: str, timeout: float, what: str) -> Ran:
        return self.run({"type": "shell", "command": command, "timeout": _clamp(timeout)}, what)

    def _observe(self, part: ObservationPart) -> Screen:
        screen = self.desktop.observe(include=(part,), **SMALLEST)
        reason = (screen.unavailable or {}).get(part)
        if reason is not None:
            raise GuestFailed(f"the guest could not give its {part.replace('_', ' ')}: {reason}")
        return screen

    def _read(self, path: str) -> bytes:
        return self.desktop.download(_within_file_roots(path))

    # --- commands -----------------------------------------------------------------------------------------------
    def execute(self, request: Request) -> Answer:
        command, shell = _command(json_object(request.body, request.content_type))
        code = None if shell else commands.pyautogui_code(command)
        if code is not None:
            ran = self.run({"type": "pyautogui", "command": code, "timeout": EXECUTE_SECONDS}, request.path)
        else:
            ran = self.shell(_line(command, shell), EXECUTE_SECONDS, request.path)
        return Answer.json(
            {"status": "success", "output": ran.stdout, "error": ran.stderr, "returncode": ran.exit_code}
        )

    def execute_with_verification(self, request: Request) -> Answer:
        data = json_object(request.body, request.content_type)
        command, shell = _command(data)
        verification = data.get("verification") or {}
        if not isinstance(verification, dict):
            raise BadRequest("'verification' must be an object")
        ran = self.shell(_line(command, shell), EXECUTE_SECONDS, request.path)
        body: dict[str, Any] = {"status": "success", "output": ran.stdout, "error": ran.stderr}
        body["returncode"] = ran.exit_code
        if not verification:
            return Answer.json(body)
        wait = min(max(_seconds(data, "max_wait_time", 10.0), 0.0), VERIFY_MAX_SECONDS)
        interval = _seconds(data, "check_interval", 1.0)
        window, check = _string(verification, "window_exists"), _string(verification, "command_success")
        start = self._clock()
        verified = self.shell(commands.verify(window, check, wait, interval), wait + QUERY_SECONDS, request.path)
        if verified.exit_code == 0:
            return Answer.json({**body, "verification": "passed", "wait_time": self._clock() - start})
        return Answer.json({**body, "status": "verification_failed", "verification": "failed", "wait_time": wait}, 500)

    def launch(self, request: Request) -> Answer:
        command, shell = _command(json_object(request.body, request.content_type))
        try:
            line = commands.launch(command, shell)
        except ValueError as exc:
            raise GuestFailed(f"cannot split the command into arguments: {exc}") from None
        tabs = self._chrome_tabs(request.path) if commands.launches_chrome(command) else None
        ran = self.shell(line, LAUNCH_SECONDS, request.path)
        if ran.exit_code != 0:
            raise GuestFailed(f"cannot launch it: {ran.last_line()}")
        if tabs is not None:
            self._chrome_launch_landed(tabs, request.path)
        shown = command if isinstance(command, str) else " ".join(command)
        return Answer.text(f"{shown} launched")

    def _chrome_tabs(self, what: str) -> int | None:
        """The running browser's tab count before a ``google-chrome`` launch; None when no browser answers (the
        launch starts one, as on OSWorld's VMs, and OSWorld's set-up waits for it by itself)."""
        try:
            tabs = guest_query.ask(_StepShell(self, what), "", "chrome_page_count", {}, CHROME_ASK_SECONDS)
        except GuestQueryError:
            return None
        return tabs if isinstance(tabs, int) else None

    def _chrome_launch_landed(self, tabs: int, what: str) -> None:
        """Return from the launch once the running browser has its window: OSWorld's next step (its
        ``chrome_open_tabs``) connects at once and closes the first tab it finds, which must not be a tab the
        launch's late window then replaces. A launch that never lands is left to the task, as on OSWorld."""
        try:
            guest_query.ask(_StepShell(self, what), "", "chrome_launch_landed", {"known": tabs}, CHROME_LANDING_SECONDS)
        except GuestQueryError as exc:
            log.info("%s: the browser's launch did not land: %s", what, exc)

    def run_python(self, request: Request) -> Answer:
        code = _string(json_object(request.body, request.content_type), "code")
        if not code:
            raise BadRequest("no code to run")
        ran = self.shell(commands.run_python(code), RUN_PYTHON_SECONDS, request.path)
        error = ran.stderr
        if ran.exit_code != 0 and not error:
            error = f"the code exited with status {ran.exit_code}"
        message = "\n".join(x for x in (ran.stdout, error) if x)
        return Answer.json(
            {
                "status": "success" if ran.exit_code == 0 else "error",
                "message": message,
                "need_more": False,
                "output": ran.stdout,
                "error": error,
                "return_code": ran.exit_code,
            }
        )

    def run_bash_script(self, request: Request) -> Answer:
        data = json_object(request.body, request.content_type)
        script = _string(data, "script")
        if not script:
            raise BadRequest("no script to run")
        timeout = _seconds(data, "timeout", BASH_DEFAULT_SECONDS)
        working_dir = _string(data, "working_dir")
        wd = guest_path(working_dir) if working_dir else None
        ran = self.shell(commands.run_bash_script(script, wd), timeout, request.path)
        if commands.NO_WORKING_DIR in ran.stderr:
            raise BadRequest(f"the working folder {wd} is not there")
        status = "success" if ran.exit_code == 0 else "error"
        return Answer.json({"status": status, "output": ran.stdout, "error": "", "returncode": ran.exit_code})

    def platform(self, request: Request) -> Answer:
        return Answer.text(self.shell(commands.PLATFORM, QUERY_SECONDS, request.path).stdout.strip())

    def cursor_position(self, request: Request) -> Answer:
        ran = self.shell(commands.CURSOR, QUERY_SECONDS, request.path)
        fields = dict(line.split("=", 1) for line in ran.stdout.splitlines() if "=" in line)
        try:
            return Answer.json([int(fields["X"]), int(fields["Y"])])
        except (KeyError, ValueError):
            raise GuestFailed(f"the guest did not say where the pointer is: {ran.last_line()}") from None

    def window_size(self, request: Request) -> Answer:
        name = form(request.body, request.content_type).fields.get("app_class_name")
        if name is None:
            raise BadRequest("app_class_name is required")
        ran = self.shell(commands.window_size(name), QUERY_SECONDS, request.path)
        try:
            size = json.loads(ran.stdout) if ran.exit_code == 0 and ran.stdout.strip() else None
        except ValueError:
            size = None
        if not (isinstance(size, dict) and all(isinstance(size.get(k), int) for k in ("width", "height"))):
            raise GuestFailed(f"no window of class {name!r} ({ran.last_line() if ran.exit_code else 'none listed'})")
        return Answer.json({"width": size["width"], "height": size["height"]})

    # --- the screen ---------------------------------------------------------------------------------------------
    def screenshot(self, request: Request) -> Answer:
        screen = self.desktop.observe(format="png", include=("cursor",))
        return Answer.data(screen.data, "image/png")

    def accessibility(self, request: Request) -> Answer:
        tree = self._observe("accessibility_tree").accessibility_tree
        if tree is None:
            raise GuestFailed("the guest gave no accessibility tree")
        return Answer.json({"AT": tree})

    def terminal(self, request: Request) -> Answer:
        return Answer.json({"output": self._observe("terminal").terminal, "status": "success"})

    def screen_size(self, request: Request) -> Answer:
        screen = self.desktop.observe(**SMALLEST)
        return Answer.json({"width": screen.width, "height": screen.height})

    # --- files --------------------------------------------------------------------------------------------------
    def file(self, request: Request) -> Answer:
        path = form(request.body, request.content_type).fields.get("file_path")
        if path is None:
            raise BadRequest("file_path is required")
        return Answer.data(self._read(path), "application/octet-stream")

    def upload(self, request: Request) -> Answer:
        sent = form(request.body, request.content_type)
        path, data = sent.fields.get("file_path"), sent.files.get("file_data")
        if path is None or data is None:
            raise BadRequest("file_path and file_data are required")
        target = _within_file_roots(path)
        written = self.desktop.upload(target, data)
        return Answer.text(f"{target}: {written} bytes written")

    def desktop_path(self, request: Request) -> Answer:
        if self.shell(commands.DESKTOP, QUERY_SECONDS, request.path).exit_code != 0:
            raise NotThere(f"the desktop user has no {GUEST_HOME}/Desktop folder")
        return Answer.json({"desktop_path": f"{GUEST_HOME}/Desktop"})

    def wallpaper(self, request: Request) -> Answer:
        ran = self.shell(commands.WALLPAPER, QUERY_SECONDS, request.path)
        path = ran.stdout.strip().replace("file://", "").replace("'", "") if ran.exit_code == 0 else ""
        if not path:
            raise NotThere(f"no wallpaper is set ({ran.last_line()})")
        return Answer.data(self._read(path), "image/png")

    def list_directory(self, request: Request) -> Answer:
        path = _string(json_object(request.body, request.content_type), "path")
        if path is None:
            raise BadRequest("path is required")
        tree = guest_query.ask(_StepShell(self, request.path), "", "list_directory", {"path": path}, QUERY_SECONDS)
        if tree is None:
            raise BadRequest(f"{path} is not a folder")
        return Answer.json({"directory_tree": tree})

    # --- set-up steps -------------------------------------------------------------------------------------------
    def change_wallpaper(self, request: Request) -> Answer:
        path = _string(json_object(request.body, request.content_type), "path")
        if not path:
            raise BadRequest("no path given")
        target = guest_path(path)
        ran = self.shell(commands.change_wallpaper(target), QUERY_SECONDS, request.path)
        if commands.NO_SUCH_PATH in ran.stderr:
            raise NotThere(f"no file {target}")
        return Answer.text(f"wallpaper set to {target}")

    def open_file(self, request: Request) -> Answer:
        path = _string(json_object(request.body, request.content_type), "path")
        if not path:
            raise BadRequest("no path given")
        target = guest_path(path)
        kind = self.shell(commands.path_kind(target, path), QUERY_SECONDS, request.path).stdout.strip()
        if kind not in ("file", "program"):
            raise NotThere(f"no file {target} and no program {path}")
        is_program = kind == "program"
        opened = self.shell(
            commands.open_file(path if is_program else target, is_program), LAUNCH_SECONDS, request.path
        )
        if opened.exit_code != 0:
            raise GuestFailed(f"cannot open {target}: {opened.last_line()}")
        name = path if is_program else posixpath.basename(target)
        titles = list(dict.fromkeys([name, posixpath.splitext(name)[0]]))
        deadline = self._clock() + OPEN_FILE_SECONDS
        while (left := deadline - self._clock()) > 0:
            wait = min(OPEN_POLL_SECONDS, left)
            if self.shell(commands.wait_window(titles, wait), wait + QUERY_SECONDS, request.path).exit_code == 0:
                return Answer.text(f"{name} opened, its window activated")
        raise GuestFailed(f"no window for {name} within {OPEN_FILE_SECONDS:.0f} s")

    def _window(self, request: Request, verb: str) -> Answer:
        data = json_object(request.body, request.content_type)
        name = _string(data, "window_name")
        if not name:
            raise BadRequest("window_name is required")
        strict, by_class = truthy(data.get("strict", False)), truthy(data.get("by_class", False))
        self.shell(commands.wmctrl(verb, name, strict, by_class), QUERY_SECONDS, request.path)
        return Answer.text(f"window {name}: {'activated' if verb == 'a' else 'closed'}")

    def activate_window(self, request: Request) -> Answer:
        return self._window(request, "a")

    def close_window(self, request: Request) -> Answer:
        return self._window(request, "c")

    def download_file(self, request: Request) -> Answer:
        raise NotSupported(
            "replicas have no network to download from; OSWorld's own set-up downloads on its host and sends the "
            "file with /setup/upload, which is served"
        )

    # --- recording ----------------------------------------------------------------------------------------------
    def start_recording(self, request: Request) -> Answer:
        self.recorder.start()
        return Answer.text("Started recording.")

    def end_recording(self, request: Request) -> Answer:
        return Answer.data(self.recorder.stop(), "video/mp4")


@dataclass(frozen=True)
class Route:
    method: str
    handler: Callable[[Endpoints, Request], Answer]
    errors: ErrorShape
    max_body: int = MAX_JSON_BYTES


S, E, T = ErrorShape.STATUS_MESSAGE, ErrorShape.ERROR, ErrorShape.TEXT
ROUTES: dict[str, Route] = {
    "/execute": Route("POST", Endpoints.execute, S),
    "/setup/execute": Route("POST", Endpoints.execute, S),
    "/execute_with_verification": Route("POST", Endpoints.execute_with_verification, S),
    "/setup/execute_with_verification": Route("POST", Endpoints.execute_with_verification, S),
    "/setup/launch": Route("POST", Endpoints.launch, S),
    "/run_python": Route("POST", Endpoints.run_python, ErrorShape.RUN_PYTHON),
    "/run_bash_script": Route("POST", Endpoints.run_bash_script, ErrorShape.BASH),
    "/platform": Route("GET", Endpoints.platform, T),
    "/cursor_position": Route("GET", Endpoints.cursor_position, E),
    "/window_size": Route("POST", Endpoints.window_size, E),
    "/screenshot": Route("GET", Endpoints.screenshot, E),
    "/accessibility": Route("GET", Endpoints.accessibility, E),
    "/terminal": Route("GET", Endpoints.terminal, S),
    "/screen_size": Route("POST", Endpoints.screen_size, E),
    "/file": Route("POST", Endpoints.file, E),
    "/setup/upload": Route("POST", Endpoints.upload, E, MAX_UPLOAD_BYTES),
    "/desktop_path": Route("POST", Endpoints.desktop_path, E),
    "/wallpaper": Route("POST", Endpoints.wallpaper, T),
    "/list_directory": Route("POST", Endpoints.list_directory, E),
    "/setup/change_wallpaper": Route("POST", Endpoints.change_wallpaper, T),
    "/setup/open_file": Route("POST", Endpoints.open_file, T),
    "/setup/activate_window": Route("POST", Endpoints.activate_window, T),
    "/setup/close_window": Route("POST", Endpoints.close_window, T),
    "/setup/download_file": Route("POST", Endpoints.download_file, T),
    "/start_recording": Route("POST", Endpoints.start_recording, S),
    "/end_recording": Route("POST", Endpoints.end_recording, S),
}


def route_for(method: str, path: str) -> Route:
    """The route of ``path`` for ``method`` (``NotThere`` for an unknown path, ``MethodNotAllowed``)."""
    route = ROUTES.get(path)
    if route is None:
        raise NotThere(f"no endpoint {path}")
    if route.method != method:
        raise MethodNotAllowed(f"{path} takes {route.method}, not {method}")
    return route
