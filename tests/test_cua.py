"""``osfleet cua serve`` driven by Cua's own client (``cua-computer`` 0.4.10, unchanged: the interface its ``Computer``
uses for a computer-server on a host) over a real host agent; only the desktop under it is a stand-in
(tests/scripted_guest.py: input events recorded, guest commands answered from a table). cua-computer 0.4 finds its
server on port 8000 of the address it is given, so each test serves on port 8000 of a loopback address of its own
(127.x.y.z), never the machine's 127.0.0.1:8000. tests/test_e2b_vm.py runs it on a real replica."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

os.environ["CUA_TELEMETRY_ENABLED"] = "false"  # cua-core reports to its vendor unless told not to, at import
from computer.interface.linux import LinuxComputerInterface  # noqa: E402

from osfleet.api.app import create_app as create_agent_app  # noqa: E402
from osfleet.config import AgentConfig  # noqa: E402
from osfleet.cua.app import LeaseOptions, create_app  # noqa: E402
from tests.e2b_guest import OPERATOR, ThreadServer  # noqa: E402
from tests.scripted_guest import SCREEN, DesktopHost, ScriptedGuest  # noqa: E402

pytestmark = pytest.mark.integration  # in-process, servers in threads on loopback; seconds in sum

LISTING = "f\x003\x00644\x00user\x00user\x001733.5\x00\x00/home/user/c.txt\x00\n"


class Stack:
    def __init__(self, home: Path) -> None:
        answers = {"echo hi": {"stdout": "hi\n"}, "find ": {"stdout": LISTING}, "exit 4": {"exit_code": 4}}
        self.guest = ScriptedGuest(answers, SCREEN)
        self.host = DesktopHost(home, ready=1, guest=self.guest)
        self.agent = ThreadServer(create_agent_app(AgentConfig(token=OPERATOR), lambda: self.host))
        self.address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        app = create_app(LeaseOptions(self.agent.url, OPERATOR, wait=10), "cua-own-token-0123456789")
        self.cua = ThreadServer(app, host=self.address, port=8000)

    def leased(self) -> list[str]:
        return [r.id for r in self.host.replicas() if r.lease is not None]

    def stop(self) -> None:
        self.cua.stop()
        self.agent.stop()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    made = Stack(tmp_path)
    yield made
    made.stop()


def drive(stack: Stack, steps: Any) -> Any:
    async def go() -> Any:
        interface = LinuxComputerInterface(stack.address)
        await interface.wait_for_ready(timeout=10)
        return await steps(interface)

    return asyncio.run(go())


def test_the_server_holds_one_lease_while_it_runs(tmp_path: Path) -> None:
    made = Stack(tmp_path)
    assert len(made.leased()) == 1
    made.cua.stop()
    assert made.leased() == []  # given back when the server stops
    made.agent.stop()


def test_pointer_keys_and_screen_reach_the_desktop(stack: Stack) -> None:
    async def steps(c: LinuxComputerInterface) -> dict[str, Any]:
        await c.move_cursor(10, 20)
        await c.left_click(100, 100)
        await c.double_click()
        await c.right_click(5, 5)
        await c.mouse_down(30, 30)
        await c.mouse_up()
        await c.drag_to(60, 30, duration=0)
        await c.drag([(0, 0), (40, 0), (40, 40)], duration=0)
        await c.scroll(2, -3)  # pynput's: 2 right, 3 down
        await c.scroll_up(1)
        await c.type_text("echo ok")
        await c.press("enter")
        await c.hotkey("ctrl", "s")
        await c.key_down("shift")
        await c.key_up("shift")
        return {"size": await c.get_screen_size(), "at": await c.get_cursor_position(), "shot": await c.screenshot()}

    got = drive(stack, steps)
    assert got["size"] == {"width": SCREEN[0], "height": SCREEN[1]}
    assert got["at"] == {"x": 40, "y": 40} and got["shot"][:4] == b"\x89PNG"
    timeline = stack.guest.timeline()
    assert timeline.count("B+left") == 6 and timeline.count("B+right") == 1  # 1 + a double + a press + 2 drags
    assert timeline.count("B+wheel-down") == 3 and timeline.count("B+wheel-up") == 1
    assert any("xdotool" in c and "click" in c and " 7" in c for c in stack.guest.commands)  # sideways: X's button 7
    assert "@100,100" in timeline and "@40,40" in timeline and "+ctrl" in timeline and "+shift" in timeline


def test_unicode_typing_through_cuas_clipboard_types_the_text(stack: Stack) -> None:
    async def steps(c: LinuxComputerInterface) -> str:
        await c.type_text("naïve ☃")  # cua-computer: set_clipboard, then the paste chord
        return await c.copy_to_clipboard()

    assert drive(stack, steps) == "naïve ☃"
    assert "+ctrl" not in stack.guest.timeline() and "+meta_l" not in stack.guest.timeline()  # no chord was pressed


def test_a_refused_action_answers_success_false_with_the_reason(stack: Stack) -> None:
    async def steps(c: LinuxComputerInterface) -> list[dict[str, Any]]:
        return [
            await c._send_command("left_click", {"x": 5000, "y": 5}),
            await c._send_command("press_key", {"key": "no-such-key"}),
            await c._send_command("teleport", {}),
            await c._send_command("move_cursor", {"x": "left"}),
        ]

    off, key, unknown, bad = drive(stack, steps)
    assert off == {"success": False, "error": off["error"]} and "off the 1920x1080 screen" in off["error"]
    assert key["success"] is False and "key" in key["error"]
    assert unknown == {"success": False, "error": "Unknown command: teleport"}
    assert bad["success"] is False and "whole number" in bad["error"]


def test_files_and_commands_are_the_desktop_users(stack: Stack) -> None:
    async def steps(c: LinuxComputerInterface) -> dict[str, Any]:
        await c.write_text("/home/user/c.txt", "cua")
        await c.write_text("/home/user/c.txt", "!", append=True)
        return {
            "text": await c.read_text("/home/user/c.txt"),
            "part": await c.read_bytes("/home/user/c.txt", offset=1, length=2),
            "run": await c.run_command("echo hi"),
            "failed": await c.run_command("exit 4"),
            "tree": await c._send_command("get_accessibility_tree"),
        }

    got = drive(stack, steps)
    assert got["text"] == "cua!" and got["part"] == b"ua"
    assert (got["run"].stdout, got["run"].returncode) == ("hi\n", 0) and got["failed"].returncode == 4
    assert got["tree"] == {"success": False, "error": "get_accessibility_tree is not served by osfleet cua serve"}
    assert stack.host.desktop_files["/home/user/c.txt"] == b"cua!"


def test_the_rest_and_websocket_paths_answer_the_same(stack: Stack) -> None:
    url = f"http://{stack.address}:8000"
    rest = httpx.post(f"{url}/cmd", json={"command": "version", "params": {}})
    assert rest.status_code == 200 and rest.text.startswith("data: {")
    assert httpx.get(f"{url}/status").json()["os_type"] == "linux"

    async def over_ws() -> Any:
        import websockets

        async with websockets.connect(f"ws://{stack.address}:8000/ws") as ws:
            await ws.send('{"command": "get_screen_size", "params": {}}')
            return await ws.recv()

    assert json.loads(asyncio.run(over_ws())) == {"success": True, "size": {"width": 1920, "height": 1080}}
    page = httpx.post(f"{url}/cmd", json={"command": "version"}, headers={"Origin": "http://evil.example"})
    assert page.status_code == 403


def test_a_screenshot_is_the_desktops_png(stack: Stack) -> None:
    answer = httpx.post(f"http://{stack.address}:8000/cmd", json={"command": "screenshot"}).text
    assert (
        answer.startswith("data: ") and base64.b64decode(answer[6:].split('"image_data": "')[1][:12])[:4] == b"\x89PNG"
    )
