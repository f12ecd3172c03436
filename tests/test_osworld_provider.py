"""osfleet.osworld: OSWorld's in-VM server protocol served from a leased session, and desktop-env's provider.

The protocol server runs on the loopback against ``FakeDesktop``, a fake of the four session methods it uses
(``step``, ``observe``, ``upload``, ``download``). Requests are sent as OSWorld's controllers send them (JSON with
its Content-Type, URL-encoded forms, the multipart layout of ``requests_toolbelt``'s ``MultipartEncoder``) and
answers are checked for the fields they read. Shell actions really run, with ``sh`` in a temporary home folder, so
the command lines are checked by what they do; the desktop's programs they call (``wmctrl``, ``gsettings``,
``xdg-open``) are stubs that log their arguments, and the few that need a real X display (``xdotool``,
python-xlib) are answered by the test. ``register`` is checked on a stand-in ``desktop_env`` package of the same
shape as desktop-env 1.0.2 (which needs torch to import, so it is not installed for tests).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from osfleet.client import (
    ConflictError,
    InfrastructureError,
    InvalidRequestError,
    LeaseError,
    NotFoundError,
    PortForward,
    Screen,
    StepResult,
)
from osfleet.osworld import ClosedPort, HarnessSettings, OsfleetProvider, ProtocolServer, commands
from osfleet.osworld.endpoints import Endpoints
from osfleet.osworld.provider import Registration
from osfleet.protocol.models import StepResult as ActionOutcome

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
JPEG = b"\xff\xd8\xff" + b"\x00" * 16
PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "  # OSWorld's PythonController.pkgs_prefix
Hook = Callable[[dict[str, Any]], ActionOutcome | None]


def ran(exit_code: int = 0, stdout: str = "", stderr: str = "", kind: str = "shell") -> ActionOutcome:
    return ActionOutcome(type=kind, ok=True, seconds=0.01, exit_code=exit_code, stdout=stdout, stderr=stderr)


def killed(kind: str = "shell") -> ActionOutcome:
    return ActionOutcome(type=kind, ok=False, seconds=30.0, error="command timed out after 30 s and was killed")


# The desktop's programs, as stubs: each logs its arguments to ~/.calls; ``wmctrl -l`` lists ~/.windows, which
# ``xdg-open`` fills with a window titled after the file it opens.
STUBS = {
    "wmctrl": 'echo "wmctrl $*" >> "$HOME/.calls"; [ "$1" = -l ] && cat "$HOME/.windows" 2>/dev/null; exit 0',
    "gsettings": 'echo "gsettings $*" >> "$HOME/.calls"',
    "xdg-open": 'echo "xdg-open $*" >> "$HOME/.calls"; '
    'echo "0x0260000a  0 desk $(basename "$1") - App" >> "$HOME/.windows"',
}


class FakeDesktop:
    """The session methods the endpoints use. Shell actions run with ``sh`` in ``home`` unless a hook answers."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.bin = home / ".stub-bin"
        self.bin.mkdir(exist_ok=True)
        for name, body in STUBS.items():
            (self.bin / name).write_text("#!/bin/sh\n" + body + "\n")
            (self.bin / name).chmod(0o755)
        self.replica_id = "r-1"
        self.lease_id = "l-1"
        self.expires_at = time.time() + 7200
        self.actions: list[dict[str, Any]] = []
        self.step_options: list[dict[str, Any]] = []
        self.observed: list[dict[str, Any]] = []
        self.files: dict[str, bytes] = {}
        self.hooks: list[Hook] = []
        self.forwarded: list[int] = []
        self.raises: Exception | None = None
        self.screen = Screen(PNG, "png", 1920, 1080)
        self.part: Screen | None = None  # the answer to an observation that includes a part
        self.resets = 0
        self.released = False

    def __repr__(self) -> str:
        return f"<FakeDesktop {self.replica_id}>"

    # the endpoints' four methods
    def step(self, actions: Sequence[dict[str, Any]], **options: Any) -> StepResult:
        assert len(actions) == 1 and options["observe"] is False
        self.actions.append(dict(actions[0]))
        self.step_options.append(options)
        if self.raises is not None:
            raise self.raises
        outcome = next((o for hook in self.hooks if (o := hook(actions[0])) is not None), None)
        outcome = outcome or self._run(actions[0])
        return StepResult("a-1", False, False, [outcome], None, [] if outcome.ok else [outcome])

    def _run(self, action: dict[str, Any]) -> ActionOutcome:
        if action["type"] == "pyautogui":
            return ran(0, "pyautogui ran\n", kind="pyautogui")
        assert action["type"] == "shell" and action.get("as_root", False) is False
        env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(self.home), "LANG": "C.UTF-8"}
        try:
            p = subprocess.run(
                ["/bin/sh", "-c", f"cd ~ && {action['command']}"],
                capture_output=True,
                text=True,
                env=env,
                timeout=min(action["timeout"], 20),
            )
        except subprocess.TimeoutExpired:
            return killed()
        return ran(p.returncode, p.stdout, p.stderr)

    def observe(
        self, *, format: Any = None, quality: Any = None, include: Sequence[str] = (), timeout: Any = None
    ) -> Screen:
        self.observed.append({"format": format, "quality": quality, "include": tuple(include)})
        if self.raises is not None:
            raise self.raises
        return self.part if include and include != ("cursor",) and self.part is not None else self.screen

    def upload(self, path: str, data: bytes, *, timeout: float | None = None) -> int:
        if self.raises is not None:
            raise self.raises
        self.files[path] = data
        return len(data)

    def download(self, path: str, *, timeout: float | None = None) -> bytes:
        if self.raises is not None:
            raise self.raises
        if path not in self.files:
            raise NotFoundError(f"download {path}: no such file", kind="not_found")
        return self.files[path]

    # the provider's
    def reset(self, task: Any = None, **options: Any) -> None:
        if self.raises is not None:
            raise self.raises
        self.resets += 1

    def release(self) -> None:
        self.released = True

    def forward(self, guest_port: int, local_port: int = 0) -> PortForward:
        self.forwarded.append(guest_port)
        return PortForward(self, guest_port, local_port)

    # tunnels: nothing listens in this desktop
    def open_tunnel(self, port: int) -> str:
        raise ConflictError(f"nothing accepted a connection to port {port} in the replica", kind="conflict")

    def tunnel_send(self, tunnel_id: str, data: bytes) -> None:
        raise NotFoundError(tunnel_id, kind="not_found")

    def tunnel_receive(self, tunnel_id: str, *, wait: float = 20.0) -> bytes | None:
        return None

    def close_tunnel(self, tunnel_id: str) -> None:
        pass

    def shells(self) -> list[str]:
        return [a["command"] for a in self.actions if a["type"] == "shell"]

    def calls(self) -> list[str]:
        """What the stub programs were called with, in order."""
        log = self.home / ".calls"
        return log.read_text().splitlines() if log.exists() else []


def answer_when(text: str, outcome: ActionOutcome) -> Hook:
    """A hook answering shell commands that contain ``text``."""
    return lambda a: outcome if a["type"] == "shell" and text in a["command"] else None


@pytest.fixture
def desktop(tmp_path: Path) -> FakeDesktop:
    home = tmp_path / "home"
    home.mkdir()
    return FakeDesktop(home)


@pytest.fixture
def port(desktop: FakeDesktop) -> Iterator[int]:
    with ProtocolServer(Endpoints(desktop)) as server:
        yield server.port


class Reply:
    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        self.status, self.content_type, self.body = status, content_type, body

    def json(self) -> Any:
        assert self.content_type == "application/json", self.content_type
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def call(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Reply(r.status, r.getheader("Content-Type", ""), r.read())
    finally:
        conn.close()


def post_json(port: int, path: str, value: Any) -> Reply:
    """As the controllers send JSON: ``data=json.dumps(...)`` with ``Content-Type: application/json``."""
    return call(port, "POST", path, json.dumps(value).encode(), {"Content-Type": "application/json"})


def post_form(port: int, path: str, fields: dict[str, str]) -> Reply:
    """As ``requests.post(url, data={...})`` sends a form."""
    body = urllib.parse.urlencode(fields).encode()
    return call(port, "POST", path, body, {"Content-Type": "application/x-www-form-urlencoded"})


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A body laid out as ``requests_toolbelt.MultipartEncoder`` lays it out."""
    boundary = "9f0f6a1d2c0e4b0e8d6b3d9c5a7e1f20"
    out = b""
    for name, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value.encode()
        out += b"\r\n"
    for name, (filename, data) in files.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'.encode()
        out += b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


# --- commands ---------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_an_agents_pyautogui_action_runs_as_osfleets_pyautogui_action(desktop: FakeDesktop, port: int) -> None:
    code = "pyautogui.click(100, 200); pyautogui.typewrite('a<b')"
    r = post_json(port, "/execute", {"command": ["python", "-c", PREFIX + code], "shell": False})
    assert r.status == 200
    assert r.json() == {"status": "success", "output": "pyautogui ran\n", "error": "", "returncode": 0}
    assert desktop.actions == [{"type": "pyautogui", "command": code, "timeout": 120.0}]
    assert desktop.step_options[0]["metadata"] == {"osworld_endpoint": "/execute"}


@pytest.mark.system
def test_execute_runs_commands_as_osworlds_server_does(desktop: FakeDesktop, port: int) -> None:
    (desktop.home / "a b.txt").write_text("in home\n")
    r = post_json(port, "/execute", {"command": ["cat", "~/a b.txt"], "shell": False})  # ~/ expanded, not split
    assert r.json() == {"status": "success", "output": "in home\n", "error": "", "returncode": 0}
    r = post_json(port, "/setup/execute", {"command": "echo out; echo err >&2; exit 3", "shell": True})
    assert r.json() == {"status": "success", "output": "out\n", "error": "err\n", "returncode": 3}
    r = post_json(port, "/execute", {"command": ["echo $0-$1", "a", "b"], "shell": True})  # list + shell: $0, $1
    assert r.json()["output"] == "a-b\n"
    r = post_json(port, "/execute", {"command": "printf %s 'x  y'", "shell": False})  # a string split by shlex
    assert r.json()["output"] == "x  y"
    r = post_json(port, "/execute", {"command": ["python", "-c", PREFIX + "DONE"]})  # not code: not pyautogui
    assert desktop.actions[-1]["type"] == "shell"
    assert all(a["timeout"] == 120.0 for a in desktop.actions)


@pytest.mark.unit
def test_execute_failures_are_answered_as_osworlds_server_answers_them(desktop: FakeDesktop, port: int) -> None:
    desktop.hooks.append(answer_when("sleep", killed()))
    r = post_json(port, "/execute", {"command": "sleep 500", "shell": True})
    assert r.status == 500 and r.json() == {"status": "error", "message": f"/execute: {killed().error}"}
    r = post_json(port, "/execute", {"command": [], "shell": False})
    assert r.status == 500 and r.json()["status"] == "error"
    r = post_json(port, "/execute", {"command": "echo 'open", "shell": False})  # shlex cannot split it
    assert r.status == 500 and "cannot split" in r.json()["message"]
    r = post_json(port, "/execute", {"command": 42})
    assert r.status == 400 and r.json()["status"] == "error"
    r = call(port, "POST", "/execute", b'{"command": "ls"}', {"Content-Type": "text/plain"})
    assert r.status == 415
    r = call(port, "POST", "/execute", b"{not json", {"Content-Type": "application/json"})
    assert r.status == 400
    assert len(desktop.actions) == 1  # only the command that could run reached the desktop


@pytest.mark.unit
def test_the_fleets_refusals_and_failures_keep_the_endpoints_shape(desktop: FakeDesktop, port: int) -> None:
    desktop.raises = LeaseError("step r-1: lease l-1 has expired", kind="lease")
    r = post_json(port, "/execute", {"command": "true", "shell": True})
    assert r.status == 502 and r.json() == {"status": "error", "message": "step r-1: lease l-1 has expired"}
    desktop.raises = InfrastructureError("step r-1: the guest agent did not answer", kind="infrastructure")
    r = post_json(port, "/run_python", {"code": "print(1)"})
    assert r.status == 502 and r.json()["error"] == "step r-1: the guest agent did not answer"
    desktop.raises = InvalidRequestError("download: 9000000 bytes, over 8 MiB", status=413, kind="too_large")
    r = post_form(port, "/file", {"file_path": "/tmp/big"})
    assert r.status == 413 and r.json() == {"error": "download: 9000000 bytes, over 8 MiB"}


@pytest.mark.system
def test_launch_starts_the_program_and_returns_at_once(desktop: FakeDesktop, port: int) -> None:
    started = time.monotonic()
    r = post_json(port, "/setup/launch", {"command": ["sh", "-c", "sleep 1; touch ~/launched"], "shell": False})
    assert r.status == 200 and time.monotonic() - started < 1.0
    for _ in range(100):
        if (desktop.home / "launched").exists():
            break
        time.sleep(0.05)
    assert (desktop.home / "launched").exists()
    r = post_json(port, "/setup/launch", {"command": "touch ~/by-shell", "shell": True})
    assert r.status == 200
    r = post_json(port, "/setup/launch", {"command": ["no-such-program-here", "x"]})
    assert r.status == 500 and "no such program" in r.json()["message"]


@pytest.mark.system
def test_a_chrome_launch_returns_once_the_running_browser_has_its_window(desktop: FakeDesktop, port: int) -> None:
    """The browser already runs here, so a launch hands its command line over and the window lands seconds later;
    OSWorld's next set-up step would close the wrong first tab. The launch asks the tab count first, then waits
    for one more; with no browser answering (a fresh start, as on OSWorld's VMs) it does not wait."""

    def query(op: str) -> str:  # how the query script's op follows the script on its command line
        return f" {op} '{{"

    def asked(op: str, since: int = 0) -> list[int]:
        return [i for i, c in enumerate(desktop.shells()) if i >= since and query(op) in c]

    desktop.hooks.append(answer_when(query("chrome_page_count"), ran(0, '{"value": 1}\n')))
    desktop.hooks.append(answer_when(query("chrome_launch_landed"), ran(0, '{"value": 2}\n')))
    desktop.hooks.append(answer_when("command -v -- google-chrome", ran(0)))  # no browser on the test's machine
    r = post_json(port, "/setup/launch", {"command": ["google-chrome", "--remote-debugging-port=1337"]})
    assert r.status == 200
    launched = [i for i, c in enumerate(desktop.shells()) if "setsid -f" in c and "google-chrome" in c]
    assert asked("chrome_page_count") < launched < asked("chrome_launch_landed"), desktop.shells()
    assert '"known": 1' in desktop.shells()[asked("chrome_launch_landed")[0]]
    no_browser = ran(0, '{"error": "RuntimeError: Chrome\'s DevTools port did not answer"}\n')
    desktop.hooks.insert(0, answer_when(query("chrome_page_count"), no_browser))
    since = len(desktop.shells())
    assert post_json(port, "/setup/launch", {"command": ["google-chrome"]}).status == 200
    assert len(asked("chrome_page_count", since)) == 1 and not asked("chrome_launch_landed", since)
    since = len(desktop.shells())
    assert post_json(port, "/setup/launch", {"command": ["sh", "-c", "true"]}).status == 200
    assert not asked("chrome_page_count", since)


@pytest.mark.system
def test_run_python_answers_osworlds_fields(desktop: FakeDesktop, port: int) -> None:
    r = post_json(port, "/run_python", {"code": "import sys\nprint('hi')\nprint(__file__.endswith('.py'))"})
    assert r.status == 200
    assert r.json() == {
        "status": "success",
        "message": "hi\nTrue\n",
        "need_more": False,
        "output": "hi\nTrue\n",
        "error": "",
        "return_code": 0,
    }
    r = post_json(port, "/run_python", {"code": "import sys; sys.exit(4)"}).json()
    assert (r["status"], r["return_code"], r["output"]) == ("error", 4, "")
    assert r["error"] == "the code exited with status 4" and r["message"] == r["error"]
    r = post_json(port, "/run_python", {"code": "raise ValueError('no')"}).json()
    assert r["status"] == "error" and r["error"].strip().endswith("ValueError: no") and r["return_code"] == 1
    assert not list(Path("/tmp").glob("osworld_*.py.leftover"))
    r = post_json(port, "/run_python", {})
    assert r.status == 400 and set(r.json()) >= {"status", "message"}
    desktop.hooks.append(answer_when("/usr/bin/python3", killed()))
    r = post_json(port, "/run_python", {"code": "while True: pass"})
    assert r.status == 500 and r.json()["output"] is None and r.json()["need_more"] is False
    assert "timed out" in r.json()["error"]
    assert all(a["timeout"] == 30.0 for a in desktop.actions)


@pytest.mark.system
def test_run_bash_script_merges_stderr_and_checks_the_working_folder(desktop: FakeDesktop, port: int) -> None:
    (desktop.home / "work").mkdir()
    work = str(desktop.home / "work")
    r = post_json(port, "/run_bash_script", {"script": "pwd; echo oops >&2; exit 2", "working_dir": work})
    assert r.status == 200
    assert r.json() == {"status": "error", "output": f"{work}\noops\n", "error": "", "returncode": 2}
    r = post_json(port, "/run_bash_script", {"script": "echo $BASH_VERSION | cut -c1", "timeout": 5})
    assert r.json()["status"] == "success" and r.json()["output"].strip().isdigit()
    assert desktop.actions[-1]["timeout"] == 5.0
    r = post_json(port, "/run_bash_script", {"script": "nosuchcommand"})  # bash's line number as OSWorld's
    assert "line 3: nosuchcommand" in r.json()["output"]
    r = post_json(port, "/run_bash_script", {"script": "true", "working_dir": "/no/such/folder"})
    assert r.status == 400 and r.json()["returncode"] == -1 and "/no/such/folder" in r.json()["output"]
    desktop.hooks.append(answer_when("cd -- /home/user/work &&", ran(0, "ok\n")))  # ~ is the desktop user's
    assert post_json(port, "/run_bash_script", {"script": "true", "working_dir": "~/work"}).json()["output"] == "ok\n"
    r = post_json(port, "/run_bash_script", {"script": ""})
    assert r.status == 400 and r.json() == {
        "status": "error",
        "output": "no script to run",
        "error": "",
        "returncode": -1,
    }
    desktop.hooks.append(answer_when("/bin/bash", killed()))
    r = post_json(port, "/run_bash_script", {"script": "sleep 1000", "timeout": 1})
    assert r.status == 500 and r.json()["returncode"] == -1


@pytest.mark.system
def test_execute_with_verification(desktop: FakeDesktop, port: int) -> None:
    desktop.hooks.append(answer_when("wmctrl -l", ran(0)))
    body = {"command": ["true"], "verification": {"window_exists": "Calc"}, "max_wait_time": 5, "check_interval": 1}
    r = post_json(port, "/setup/execute_with_verification", body)
    assert r.status == 200 and r.json()["verification"] == "passed" and r.json()["returncode"] == 0
    assert "grep -qiF -- Calc" in desktop.shells()[-1]
    desktop.hooks.insert(0, answer_when("wmctrl -l", ran(1)))
    r = post_json(port, "/setup/execute_with_verification", body)
    assert r.status == 500 and r.json()["status"] == "verification_failed" and r.json()["wait_time"] == 5
    r = post_json(port, "/setup/execute_with_verification", {"command": "echo hi", "shell": True})
    assert r.json() == {"status": "success", "output": "hi\n", "error": "", "returncode": 0}


@pytest.mark.system
def test_platform_cursor_and_window_size(desktop: FakeDesktop, port: int) -> None:
    desktop.hooks.append(answer_when("xdotool getmouselocation", ran(0, "X=640\nY=360\nSCREEN=0\nWINDOW=41943\n")))
    assert post_json(port, "/platform", {}).status == 405  # GET, as OSWorld's
    r = call(port, "GET", "/platform")
    assert r.status == 200 and r.text == os.uname().sysname
    r = call(port, "GET", "/cursor_position")
    assert r.json() == [640, 360]
    desktop.hooks.append(answer_when("_NET_CLIENT_LIST", ran(0, '{"width": 1280, "height": 720}\n')))
    r = post_form(port, "/window_size", {"app_class_name": "gimp"})
    assert r.json() == {"width": 1280, "height": 720}
    assert desktop.shells()[-1].endswith(" gimp") and "/usr/bin/python3 -c" in desktop.shells()[-1]
    desktop.hooks.insert(0, answer_when("_NET_CLIENT_LIST", ran(0, "")))
    assert post_form(port, "/window_size", {"app_class_name": "nothing"}).status == 500
    assert post_form(port, "/window_size", {}).status == 400


# --- the screen -------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_screenshot_has_the_pointer_and_parts_come_with_the_smallest_screenshot(
    desktop: FakeDesktop, port: int
) -> None:
    r = call(port, "GET", "/screenshot")
    assert r.status == 200 and r.content_type == "image/png" and r.body == PNG
    assert desktop.observed[-1] == {"format": "png", "quality": None, "include": ("cursor",)}
    desktop.part = Screen(JPEG, "jpeg", 1920, 1080, 1, "<desktop-frame/>", "user@desk:~$ ls")
    assert call(port, "GET", "/accessibility").json() == {"AT": "<desktop-frame/>"}
    assert desktop.observed[-1] == {"format": "jpeg", "quality": 1, "include": ("accessibility_tree",)}
    assert call(port, "GET", "/terminal").json() == {"output": "user@desk:~$ ls", "status": "success"}
    assert desktop.observed[-1]["include"] == ("terminal",)
    assert call(port, "POST", "/screen_size").json() == {"width": 1920, "height": 1080}
    desktop.part = Screen(JPEG, "jpeg", 1920, 1080, 1, None, None)
    assert call(port, "GET", "/terminal").json() == {"output": None, "status": "success"}  # no terminal focused
    desktop.part = Screen(JPEG, "jpeg", 1920, 1080, 1, None, None, {"accessibility_tree": "AT-SPI is not up"})
    r = call(port, "GET", "/accessibility")
    assert r.status == 500 and "AT-SPI is not up" in r.json()["error"]


# --- files ------------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_file_reads_as_osworlds_server_resolves_the_path(desktop: FakeDesktop, port: int) -> None:
    desktop.files["/home/user/Desktop/report.docx"] = b"PK\x03\x04 docx"
    for path in ("~/Desktop/report.docx", "$HOME/Desktop/report.docx", "Desktop/report.docx"):
        r = post_form(port, "/file", {"file_path": path})
        assert r.status == 200 and r.body == b"PK\x03\x04 docx"
    r = post_form(port, "/file", {"file_path": "/home/user/missing.txt"})
    assert r.status == 404 and r.json() == {"error": "download /home/user/missing.txt: no such file"}
    r = post_form(port, "/file", {"file_path": "/etc/passwd"})
    assert r.status == 403 and "/home/user/" in r.json()["error"]
    r = post_form(port, "/file", {"file_path": "/tmp/../etc/shadow"})
    assert r.status == 403 and r.json()["error"].startswith("/etc/shadow")
    assert post_form(port, "/file", {}).status == 400


@pytest.mark.unit
def test_upload_takes_osworlds_multipart_form(desktop: FakeDesktop, port: int) -> None:
    data = bytes(range(256)) * 64 + b"\r\n--not-the-boundary\r\n"
    body, ctype = multipart({"file_path": "~/Desktop/in put.xlsx"}, {"file_data": ("in put.xlsx", data)})
    r = call(port, "POST", "/setup/upload", body, {"Content-Type": ctype})
    assert r.status == 200 and desktop.files == {"/home/user/Desktop/in put.xlsx": data}
    body, ctype = multipart({"file_path": "/opt/x"}, {"file_data": ("x", b"x")})
    r = call(port, "POST", "/setup/upload", body, {"Content-Type": ctype})
    assert r.status == 403
    body, ctype = multipart({"file_path": "~/x"}, {})
    r = call(port, "POST", "/setup/upload", body, {"Content-Type": ctype})
    assert r.status == 400 and r.json() == {"error": "file_path and file_data are required"}


@pytest.mark.unit
def test_bodies_over_the_limit_or_without_a_length_are_not_read(desktop: FakeDesktop, port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("POST", "/setup/upload")
    conn.putheader("Content-Type", "multipart/form-data; boundary=x")
    conn.putheader("Content-Length", str(2**30))
    conn.endheaders()  # and no body: the answer comes without it, and the connection closes
    raw = conn.getresponse()
    assert raw.status == 413 and "limit" in json.loads(raw.read())["error"]
    assert raw.getheader("Connection") == "close"
    conn.close()
    r = call(port, "POST", "/execute", b"x" * (3 * 2**20), {"Content-Type": "application/json"})
    assert r.status == 413 and r.json()["status"] == "error"  # read and dropped: its client gets the answer
    body, ctype = multipart({"file_path": "/tmp/big"}, {"file_data": ("big", b"\0" * (17 * 2**20))})
    r = call(port, "POST", "/setup/upload", body, {"Content-Type": ctype})
    assert r.status == 413 and "16777216" in r.json()["error"]
    r = call(port, "POST", "/execute", b"", {"Transfer-Encoding": "chunked", "Content-Type": "application/json"})
    assert r.status == 411
    assert call(port, "GET", "/nope").status == 404
    assert desktop.actions == [] and desktop.files == {}


@pytest.mark.system
def test_desktop_path_wallpaper_and_list_directory(desktop: FakeDesktop, port: int) -> None:
    desktop.hooks.append(answer_when('test -d "$HOME/Desktop"', ran(0)))
    assert call(port, "POST", "/desktop_path").json() == {"desktop_path": "/home/user/Desktop"}
    desktop.hooks.insert(0, answer_when('test -d "$HOME/Desktop"', ran(1)))
    assert call(port, "POST", "/desktop_path").status == 404
    desktop.hooks.append(answer_when("picture-uri", ran(0, "'file:///home/user/Pictures/w.png'\n")))
    desktop.files["/home/user/Pictures/w.png"] = PNG
    r = call(port, "POST", "/wallpaper")
    assert r.status == 200 and r.body == PNG and r.content_type == "image/png"
    desktop.hooks.insert(0, answer_when("picture-uri", ran(0, "'file:///usr/share/backgrounds/warty.png'\n")))
    assert call(port, "POST", "/wallpaper").status == 403  # outside the user's home and /tmp
    folder = desktop.home / "Desktop"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / "sub" / "b.txt").write_text("b")
    r = post_json(port, "/list_directory", {"path": str(folder)})  # osfleet's query script, run for real
    assert r.json() == {
        "directory_tree": {
            "type": "directory",
            "name": "Desktop",
            "children": [
                {"type": "file", "name": "a.txt"},
                {"type": "directory", "name": "sub", "children": [{"type": "file", "name": "b.txt"}]},
            ],
        }
    }
    r = post_json(port, "/list_directory", {"path": str(folder / "a.txt")})
    assert r.status == 400 and "not a folder" in r.json()["error"]
    assert post_json(port, "/list_directory", {}).status == 400


# --- set-up steps -----------------------------------------------------------------------------------------------
@pytest.mark.system
def test_window_and_wallpaper_set_up_steps(desktop: FakeDesktop, port: int) -> None:
    r = post_json(port, "/setup/activate_window", {"window_name": "Writer", "strict": True, "by_class": True})
    assert r.status == 200 and desktop.calls()[-1] == "wmctrl -xFa Writer"
    r = post_json(port, "/setup/close_window", {"window_name": "a 'b' $(c)", "strict": False, "by_class": False})
    assert r.status == 200 and desktop.calls()[-1] == "wmctrl -c a 'b' $(c)"
    r = post_json(port, "/setup/activate_window", {})
    assert r.status == 400 and r.content_type.startswith("text/html")
    wallpaper = desktop.home / "w.jpg"
    wallpaper.write_bytes(JPEG)
    assert post_json(port, "/setup/change_wallpaper", {"path": str(wallpaper)}).status == 200
    assert desktop.calls()[-1] == f"gsettings set org.gnome.desktop.background picture-uri file://{wallpaper}"
    r = post_json(port, "/setup/change_wallpaper", {"path": "/no/such.jpg"})
    assert r.status == 404 and r.text == "no file /no/such.jpg" and len(desktop.calls()) == 3
    assert post_json(port, "/setup/change_wallpaper", {}).status == 400


@pytest.mark.system
def test_open_file_waits_for_its_window(desktop: FakeDesktop, port: int) -> None:
    notes = desktop.home / "notes.odt"
    notes.write_text("x")
    r = post_json(port, "/setup/open_file", {"path": str(notes)})
    assert r.status == 200
    calls = desktop.calls()  # xdg-open runs detached: the first look may come before its window
    assert f"xdg-open {notes}" in calls and calls[-2:] == ["wmctrl -l", "wmctrl -i -a 0x0260000a"]
    r = post_json(port, "/setup/open_file", {"path": "/nothing/here.odt"})
    assert r.status == 404 and r.content_type.startswith("text/html")
    (desktop.home / ".windows").unlink()
    windows = iter([ran(1), ran(0)])  # the window shows on the second wait
    desktop.hooks.append(lambda a: next(windows) if "wmctrl -l" in a["command"] else None)
    assert post_json(port, "/setup/open_file", {"path": str(notes)}).status == 200
    assert sum("wmctrl -l" in c for c in desktop.shells()) == 3


@pytest.mark.unit
def test_what_is_not_served_says_so(desktop: FakeDesktop, port: int) -> None:
    r = call(port, "POST", "/end_recording")  # recording is served (tests/test_osworld_recording.py): none yet
    assert r.status == 400 and r.json()["status"] == "error" and "no recording" in r.json()["message"]
    r = post_json(port, "/setup/download_file", {"url": "https://example.org/x", "path": "~/x"})
    assert r.status == 501 and "/setup/upload" in r.text
    assert desktop.actions == []


@pytest.mark.system
def test_command_lines_quote_what_the_request_carries(tmp_path: Path) -> None:
    hostile = "$(touch pwned); `touch pwned2`; 'quote\"; rm -rf ~"
    for line in (
        commands.wmctrl("a", hostile, False, False),
        commands.change_wallpaper(hostile),
        commands.window_size(hostile),
        commands.path_kind(hostile, hostile),
        commands.wait_window([hostile], 1),
        commands.verify(hostile, None, 0, 0.1),
        commands.run_bash_script("true", hostile),
    ):
        subprocess.run(["/bin/sh", "-c", line], cwd=tmp_path, capture_output=True, timeout=20)
    assert list(tmp_path.iterdir()) == []
    assert commands.pyautogui_code(["python", "-c", PREFIX + "x()"]) == "x()"
    assert commands.pyautogui_code(["python3", "-c", PREFIX + " FAIL "]) is None
    assert commands.pyautogui_code(["python", "-c", "import os"]) is None
    assert commands.pyautogui_code("python -c x") is None


# --- the provider -----------------------------------------------------------------------------------------------
class FakeFleet:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.leased: list[FakeDesktop] = []
        self.closed = False
        self.lease_options: list[dict[str, Any]] = []

    def lease(self, holder: str = "x", *, ttl: float | None = None, wait: float = 0) -> FakeDesktop:
        self.lease_options.append({"holder": holder, "ttl": ttl, "wait": wait})
        d = FakeDesktop(self.home)
        d.replica_id = f"r-{len(self.leased) + 1}"
        self.leased.append(d)
        return d

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fleet(tmp_path: Path) -> FakeFleet:
    return FakeFleet(tmp_path)


def registration(fleet: FakeFleet, **settings: Any) -> Registration:
    connected: list[tuple[str, str | None, str | None]] = []

    def connect(url: str, token: str | None, token_file: str | None) -> FakeFleet:
        connected.append((url, token, token_file))
        return fleet

    reg = Registration(HarnessSettings(url="http://fleet.test:8080", token="t", **settings), connect)
    reg.connected = connected  # type: ignore[attr-defined]
    return reg


@pytest.mark.unit
def test_a_provider_leases_serves_resets_and_releases(fleet: FakeFleet) -> None:
    reg = registration(fleet)
    provider = OsfleetProvider(reg)
    path = reg.settings.fleet_url()
    provider.start_emulator(path, True, "Ubuntu")
    provider.start_emulator(path, True, "Ubuntu")  # DesktopEnv starts again after each revert: one lease
    assert len(fleet.leased) == 1 and reg.connected == [("http://fleet.test:8080", "t", None)]  # type: ignore[attr-defined]
    assert fleet.lease_options == [{"holder": "osworld-desktop-env", "ttl": 7200.0, "wait": 600.0}]
    host, server, chrome, vnc, vlc = provider.get_ip_address(path).split(":")
    assert host == "127.0.0.1" and len({server, chrome, vnc, vlc}) == 4
    assert call(int(server), "GET", "/screenshot").body == PNG
    with pytest.raises(ConnectionRefusedError):  # VNC: held closed, refused at once, never another VNC server
        socket.create_connection(("127.0.0.1", int(vnc)), timeout=5)
    # Chrome's DevTools: a forward of the lease to the guest's 1337; nothing listens there in this fake, so the
    # connection is accepted here and closed when the tunnel is refused
    assert fleet.leased[0].forwarded == [1337]
    with socket.create_connection(("127.0.0.1", int(chrome)), timeout=5) as conn:
        conn.settimeout(10)
        assert conn.recv(10) == b""
    # VLC's port: each request asked again in the guest (osfleet.osworld.guest_http), as a shell step
    status = {"status": 200, "content_type": "text/xml", "body": base64.b64encode(b"<root/>").decode()}
    fleet.leased[0].hooks.append(answer_when("urllib.request", ran(0, json.dumps(status) + "\n")))
    got = call(int(vlc), "GET", "/requests/status.xml", headers={"Authorization": "Basic OnBhc3N3b3Jk"})
    assert (got.status, got.content_type, got.body) == (200, "text/xml", b"<root/>")
    asked = fleet.leased[0].actions[-1]["command"]
    assert "8080" in asked and "/requests/status.xml" in asked and "Basic OnBhc3N3b3Jk" in asked
    assert provider.revert_to_snapshot(path, "init_state") == path and fleet.leased[0].resets == 1
    with pytest.raises(ValueError, match="init_state"):
        provider.revert_to_snapshot(path, "my_snapshot")
    with pytest.raises(NotImplementedError):
        provider.save_state(path, "s")
    provider.stop_emulator(path)
    provider.stop_emulator(path)
    assert fleet.leased[0].released
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(server)), timeout=5)
    with pytest.raises(RuntimeError):
        provider.get_ip_address(path)
    with pytest.raises(ValueError, match="Ubuntu"):
        provider.start_emulator(path, True, "Windows")


@pytest.mark.unit
def test_a_lost_or_ending_lease_is_replaced_at_the_next_start(fleet: FakeFleet) -> None:
    reg = registration(fleet)
    provider = OsfleetProvider(reg)
    path = reg.settings.fleet_url()
    provider.start_emulator(path, True, "Ubuntu")
    first = fleet.leased[0]
    first.raises = LeaseError("reset r-1: lease l-1 has expired", kind="lease")
    provider.revert_to_snapshot(path, "init_state")
    assert first.released and provider.desktop is None
    provider.start_emulator(path, True, "Ubuntu")
    second = fleet.leased[1]
    assert provider.desktop is second
    second.expires_at = time.time() + 60  # under renew_below_seconds: a new lease, not a reset
    provider.revert_to_snapshot(path, "init_state")
    assert second.released and second.resets == 0
    provider.start_emulator(path, True, "Ubuntu")
    assert provider.desktop is fleet.leased[2]
    reg.close()  # what the exit hook does
    assert fleet.leased[2].released and fleet.closed


@pytest.mark.unit
def test_the_fleet_and_token_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("OSFLEET_URL", "OSFLEET_TOKEN", "OSFLEET_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidRequestError, match="OSFLEET_URL"):
        HarnessSettings().fleet_url()
    monkeypatch.setenv("OSFLEET_URL", "http://fleet:8080/")
    assert HarnessSettings().fleet_url() == "http://fleet:8080"
    assert HarnessSettings().fleet_url("https://other:8443") == "https://other:8443"  # DesktopEnv's path_to_vm
    with pytest.raises(InvalidRequestError, match="http"):
        HarnessSettings().fleet_url("/var/lib/vms/Ubuntu.qcow2")
    assert HarnessSettings().credentials() == (None, None)  # the client reads $OSFLEET_API_TOKEN itself
    monkeypatch.setenv("OSFLEET_TOKEN_FILE", str(tmp_path / "token"))
    assert HarnessSettings().credentials() == (None, str(tmp_path / "token"))
    monkeypatch.setenv("OSFLEET_TOKEN", "from-env")
    assert HarnessSettings().credentials() == ("from-env", None)
    assert HarnessSettings(token_file="f").credentials() == (None, "f")
    assert HarnessSettings(token="given", token_file="f").credentials() == ("given", None)


@pytest.mark.unit
def test_closed_ports_refuse_connections_and_cannot_be_taken() -> None:
    port = ClosedPort()
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port.port), timeout=5)
        other = socket.socket()
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port.port))
        other.close()
    finally:
        port.stop()


# --- register() on a stand-in desktop-env ------------------------------------------------------------------------
# The same shape as desktop-env 1.0.2 where register() touches it: the factory in desktop_env.providers, imported
# by name into desktop_env.desktop_env; DesktopEnv.__init__ calling it, then refusing names outside its sets, then
# starting the provider and reading the ports from get_ip_address; reset reverting only a used environment.
STAND_IN = {
    "__init__.py": "",
    "providers/base.py": """
        import abc
        class Provider(abc.ABC):
            pass
        class VMManager(abc.ABC):
            pass
    """,
    "providers/__init__.py": """
        class Docker:
            def get_vm_path(self, **kwargs):
                return "Ubuntu.qcow2"
            def start_emulator(self, path_to_vm, headless, os_type):
                pass
            def get_ip_address(self, path_to_vm):
                return "localhost:5000:9222:8006:8080"
        def create_vm_manager_and_provider(provider_name, region, use_proxy=False):
            if provider_name.lower().strip() == "docker":
                return Docker(), Docker()
            raise NotImplementedError(provider_name + " not implemented")
    """,
    "desktop_env.py": """
        from desktop_env.providers import create_vm_manager_and_provider
        class DesktopEnv:
            def __init__(self, provider_name="vmware", region=None, path_to_vm=None, snapshot_name="init_state",
                         action_space="pyautogui", os_type="Ubuntu", client_password=""):
                self.provider_name = provider_name
                self.client_password = client_password or "password"
                self.server_port, self.chromium_port, self.vnc_port, self.vlc_port = 5000, 9222, 8006, 8080
                self.manager, self.provider = create_vm_manager_and_provider(provider_name, region, use_proxy=False)
                if provider_name in {"docker", "aws"}:
                    self.is_environment_used = False
                elif provider_name in {"vmware"}:
                    self.is_environment_used = True
                else:
                    raise ValueError("Invalid provider name: " + provider_name)
                self.path_to_vm = path_to_vm or self.manager.get_vm_path(os_type=os_type, region=region,
                                                                         screen_size=(1920, 1080))
                self.snapshot_name = snapshot_name
                self.os_type = os_type
                self._start_emulator()
                assert action_space in ["computer_13", "pyautogui"]
            def _start_emulator(self):
                self.provider.start_emulator(self.path_to_vm, True, self.os_type)
                parts = self.provider.get_ip_address(self.path_to_vm).split(":")
                self.vm_ip = parts[0]
                self.server_port, self.chromium_port, self.vnc_port, self.vlc_port = map(int, parts[1:])
            def reset(self):
                if self.is_environment_used:
                    self.provider.revert_to_snapshot(self.path_to_vm, self.snapshot_name)
                    self._start_emulator()
                self.is_environment_used = True
            def close(self):
                self.provider.stop_emulator(self.path_to_vm)
    """,
}


@pytest.fixture
def desktop_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    root = tmp_path / "site"
    for name, text in STAND_IN.items():
        (root / "desktop_env" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "desktop_env" / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "desktop_env" or m.startswith("desktop_env.")]:
        monkeypatch.delitem(sys.modules, name)
    import desktop_env.desktop_env

    yield desktop_env.desktop_env
    from osfleet.osworld import unregister

    unregister()


@pytest.mark.unit
def test_register_lets_desktop_env_lease_from_osfleet(desktop_env: Any, fleet: FakeFleet) -> None:
    import desktop_env.providers as providers
    from desktop_env.providers.base import Provider, VMManager

    from osfleet.osworld import register

    original_factory, original_init = providers.create_vm_manager_and_provider, desktop_env.DesktopEnv.__init__
    settings = HarnessSettings(url="http://fleet.test:8080", token="t")
    register(settings, connect=lambda url, token, token_file: fleet)
    register(settings, connect=lambda url, token, token_file: fleet)  # idempotent: wrapped once
    assert desktop_env.create_vm_manager_and_provider.__wrapped__ is original_factory
    assert desktop_env.DesktopEnv.__init__.__wrapped__ is original_init

    env = desktop_env.DesktopEnv(provider_name="osfleet", action_space="pyautogui")
    assert env.provider_name == "osfleet" and isinstance(env.provider, OsfleetProvider)
    assert isinstance(env.provider, Provider) and isinstance(env.manager, VMManager)
    assert env.is_environment_used is False and env.client_password == "password"
    assert env.path_to_vm == "http://fleet.test:8080" and env.vm_ip == "127.0.0.1"
    assert call(env.server_port, "GET", "/screenshot").body == PNG
    register(settings, connect=lambda url, token, token_file: fleet)  # again: the env keeps its replica
    assert not fleet.leased[0].released
    env.reset()  # clean at the start: no revert
    env.reset()  # used: reset, same server
    assert fleet.leased[0].resets == 1 and len(fleet.leased) == 1
    env.close()
    assert fleet.leased[0].released

    docker = desktop_env.DesktopEnv(provider_name="docker")  # every other name is desktop-env's own
    assert docker.provider_name == "docker" and type(docker.provider).__name__ == "Docker"
    assert (docker.server_port, docker.path_to_vm) == (5000, "Ubuntu.qcow2")
    with pytest.raises(NotImplementedError):
        desktop_env.DesktopEnv(provider_name="nope")
    with pytest.raises(AssertionError):  # __init__ fails after the lease: the replica is given back
        desktop_env.DesktopEnv("osfleet", action_space="claude")
    assert fleet.leased[-1].released and len(fleet.leased) == 2

    from osfleet.osworld import unregister

    unregister()
    assert providers.create_vm_manager_and_provider is original_factory
    assert desktop_env.create_vm_manager_and_provider is original_factory
    assert desktop_env.DesktopEnv.__init__ is original_init
    with pytest.raises(NotImplementedError):
        desktop_env.DesktopEnv(provider_name="osfleet")


@pytest.mark.unit
def test_register_without_desktop_env_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from osfleet.osworld import register

    monkeypatch.setitem(sys.modules, "desktop_env", None)
    with pytest.raises(ImportError, match="pip install desktop-env"):
        register()


@pytest.mark.system
def test_the_harness_imports_without_the_servers_packages() -> None:
    """It runs on a client-only install: libvirt, FastAPI and the rest of the host's packages made unimportable."""
    code = (
        "import sys, importlib.abc\n"
        "HOST = {'libvirt', 'fastapi', 'fabric', 'invoke', 'paramiko', 'pulumi', 'locust', 'uvicorn', 'starlette',\n"
        "        'prometheus_client', 'psutil', 'jinja2', 'wsproto', 'desktop_env'}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in HOST:\n"
        "            raise ModuleNotFoundError('blocked: ' + name, name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import osfleet.osworld, osfleet.osworld.endpoints\n"
        "assert 'osfleet.replicas' not in sys.modules and 'osfleet.api' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


RUNNER = """
import argparse
from desktop_env.desktop_env import DesktopEnv
import desktop_env.providers as providers
parser = argparse.ArgumentParser()
parser.add_argument("--provider_name", type=str, default="vmware", choices=["vmware", "docker", "aws"])
parser.add_argument("--num_envs", type=int, default=1)
args = parser.parse_args()
factory = providers.create_vm_manager_and_provider
print(args.provider_name, args.num_envs, getattr(factory, "__osfleet_osworld__", False))
"""


@pytest.mark.system
def test_osworlds_runners_take_osfleet_as_their_provider_through_the_wrapper(desktop_env: Any, tmp_path: Path) -> None:
    script = tmp_path / "run_multienv.py"
    script.write_text(RUNNER)
    site = str(Path(desktop_env.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, str(Path(__file__).parent.parent)])}
    run = [sys.executable, "-m", "osfleet.osworld.run", str(script), "--provider_name", "osfleet", "--num_envs", "3"]
    out = subprocess.run(run, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["osfleet", "3", "True"]  # the choice taken, the factory registered
    plain = subprocess.run([sys.executable, str(script), "--provider_name", "osfleet"], capture_output=True,
                           text=True, env=env, timeout=60)  # fmt: skip
    assert plain.returncode == 2 and "invalid choice" in plain.stderr  # without the wrapper: refused, as published
    missing = subprocess.run([sys.executable, "-m", "osfleet.osworld.run", str(tmp_path / "none.py")],
                             capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == f"osfleet.osworld.run: error: no such script: {tmp_path / 'none.py'}"
    )
