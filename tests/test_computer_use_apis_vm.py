"""The input primitives on a real desktop replica (heavy: run under the lock).

    flock /tmp/osfleet-heavy.lock .venv/bin/python -m pytest -m vm -n0 tests/test_computer_use_apis_vm.py

What the guest's X server makes of osfleet's input: Unicode text through every spare key, back/forward buttons,
both wheels, modifiers held, the pointer's position, a drag's time and a held key; region screenshots against the
full screen. The drivers and bad input through a host agent: tests/test_computer_use_examples_vm.py.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image, ImageChops

from osfleet.config import Settings
from osfleet.protocol.actions import ACTIONS, ActionResult
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

pytestmark = [pytest.mark.vm, pytest.mark.slow]


@pytest.fixture(scope="module")
def desktop(golden: GoldenImage) -> Iterator[tuple[ReplicaHost, str]]:
    with ReplicaHost(golden, Settings.from_env(), warm=0, auto_recover=False, spares=False) as host:
        rid = host.create("snapshot").replica
        try:
            yield host, rid
        finally:
            host.down([rid])


def act(host: ReplicaHost, rid: str, *actions: dict[str, Any]) -> list[ActionResult]:
    results = host.act(rid, ACTIONS.validate_python(list(actions)))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return results


def sh(host: ReplicaHost, rid: str, command: str) -> str:
    return str(host.shell(rid, command, 30)["stdout"])


def wait_for(what: str, check: Any, seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got, f"{what}: not within {seconds:g} s"
            return got
        time.sleep(0.3)


def a_window(host: ReplicaHost, rid: str, title: str, command: str) -> None:
    """Start ``command`` in a window titled ``title`` at 500,400 (twm places a window with a geometry itself)."""
    sh(host, rid, f"(setsid {command} >/dev/null 2>&1 &)")
    wait_for(title, lambda: title in sh(host, rid, f"xdotool search --name {title} getwindowname 2>/dev/null"))


def test_unicode_text_reaches_a_utf8_window_through_spare_keys(desktop: tuple[ReplicaHost, str]) -> None:
    host, rid = desktop
    sh(host, rid, "rm -f /tmp/typed.txt")
    a_window(
        host,
        rid,
        "typed",
        "env LC_ALL=C.UTF-8 xterm -u8 -geometry 60x8+500+400 -title typed -e sh -c 'cat > /tmp/typed.txt'",
    )
    greek = "αβγδεζηθικλμνξοπρστυφχψω"  # more distinct characters than there are spare keys
    text = f"Grüße, €5 — naïve ☃ 日本 {greek} {greek[::-1]}\n"
    act(host, rid, {"type": "move", "x": 600, "y": 450}, {"type": "type", "text": text})
    typed = wait_for("the typed line", lambda: sh(host, rid, "cat /tmp/typed.txt 2>/dev/null").endswith("\n"))
    assert sh(host, rid, "cat /tmp/typed.txt") == text
    sh(host, rid, "pkill -f 'title typed' || true")
    del typed


def test_buttons_wheels_and_modifiers_reach_x_as_asked(desktop: tuple[ReplicaHost, str]) -> None:
    host, rid = desktop
    sh(host, rid, "rm -f /tmp/xev.txt")
    a_window(host, rid, "events", "sh -c 'xev -name events -geometry 300x300+500+300 -event button > /tmp/xev.txt'")
    act(
        host,
        rid,
        {"type": "click", "x": 650, "y": 450, "button": "back"},
        {"type": "click", "button": "forward", "keys": ["ctrl"]},
        {"type": "scroll", "clicks": 2, "clicks_x": -1},
        {"type": "scroll", "clicks": -1, "clicks_x": 3, "keys": ["shift"]},
        {"type": "click", "count": 3},
    )

    def pressed() -> list[tuple[int, int]]:
        out = sh(host, rid, "cat /tmp/xev.txt")
        found = []
        for block in out.split("ButtonPress event")[1:]:
            state = int(block.split("state ", 1)[1].split(",", 1)[0], 16)
            button = int(block.split("button ", 1)[1].split(",", 1)[0])
            found.append((button, state))
        return found if len(found) >= 12 else []

    seen = wait_for("the button presses", pressed)
    sh(host, rid, "pkill xev || true")
    buttons = [b for b, _ in seen]
    # X's buttons: 8 back, 9 forward, 5 down, 4 up, 6 left, 7 right, 1 left
    assert buttons == [8, 9, 5, 5, 6, 4, 7, 7, 7, 1, 1, 1], seen
    held = [state & 0x5 for _, state in seen]  # ShiftMask 0x1, ControlMask 0x4
    assert held == [0, 4, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0], seen  # ctrl with forward, shift with the second scroll


def test_the_pointer_position_is_where_x_has_it(desktop: tuple[ReplicaHost, str]) -> None:
    host, rid = desktop
    for x, y in ((0, 0), (1279, 799), (123, 456)):
        [_, here] = act(host, rid, {"type": "move", "x": x, "y": y}, {"type": "cursor_position"})
        assert (here.x, here.y) == (x, y)
        assert sh(host, rid, "xdotool getmouselocation --shell").split()[:2] == [f"X={x}", f"Y={y}"]
    # the agent's own code moved it: the guest is asked
    [_, here] = act(host, rid, {"type": "shell", "command": "xdotool mousemove 10 20"}, {"type": "cursor_position"})
    assert (here.x, here.y) == (10, 20)


def test_a_drag_takes_its_time_and_a_held_key_is_held(desktop: tuple[ReplicaHost, str]) -> None:
    host, rid = desktop
    [drag, hold] = act(
        host,
        rid,
        {"type": "drag", "path": [[700, 100], [800, 100], [800, 200], [900, 200]], "seconds": 1.5},
        {"type": "hold_key", "keys": ["shift"], "seconds": 1},
    )
    assert 1.5 <= drag.seconds < 4 and 1 <= hold.seconds < 3
    assert sh(host, rid, "xdotool getmouselocation --shell").split()[:2] == ["X=900", "Y=200"]


def test_a_region_screenshot_is_the_screens_pixels_scaled_as_asked(desktop: tuple[ReplicaHost, str]) -> None:
    host, rid = desktop
    full, region, small = act(
        host,
        rid,
        {"type": "move", "x": 1270, "y": 790},
        {"type": "screenshot"},
        {"type": "screenshot", "region": [0, 0, 640, 400]},
        {"type": "screenshot", "region": [0, 0, 640, 400], "width": 320},
    )[1:]

    def image(r: ActionResult) -> Image.Image:
        return Image.open(io.BytesIO(base64.b64decode(r.content_base64 or ""))).convert("RGB")

    assert image(full).size == (1280, 800) and (small.width, small.height) == (320, 200)
    assert ImageChops.difference(image(full).crop((0, 0, 640, 400)), image(region)).getbbox() is None
    assert image(small).size == (320, 200)
