"""OSWorld's action spaces on a real office replica (heavy: run under the lock).

    flock /tmp/osfleet-heavy.lock .venv/bin/python -m pytest -m vm tests/test_osworld_actions_vm.py

pyautogui code runs in the guest as the desktop user (pyautogui imports, finds the display, types ``<`` right);
computer_13 actions reach X as QEMU input events; code that raises or runs too long fails only its action; the
observation's accessibility tree is OSWorld's XML and the pointer is in the screenshot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import ImageChops

from osfleet.api.observe import observe
from osfleet.api.state import LeasedHost
from osfleet.config import Settings
from osfleet.protocol.actions import ACTIONS
from osfleet.replicas.leases import Claim
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

pytestmark = [pytest.mark.vm, pytest.mark.slow]


@pytest.fixture(scope="module")
def office(office_image: GoldenImage) -> Iterator[tuple[ReplicaHost, str]]:
    settings = Settings.from_env()
    with ReplicaHost(office_image, settings, mode="snapshot", auto_recover=False) as host:
        rid = host.create().replica
        try:
            yield host, rid
        finally:
            host.down([rid])


def act(host: ReplicaHost, rid: str, *actions: dict[str, Any]) -> list[Any]:
    return host.act(rid, ACTIONS.validate_python(list(actions)))


def sh(host: ReplicaHost, rid: str, command: str) -> str:
    return str(host.shell(rid, command, 30)["stdout"])


def c13(action_type: str, **parameters: Any) -> dict[str, Any]:
    return {"type": "computer_13", "action": {"action_type": action_type, "parameters": parameters}}


def typed_into_a_fresh_terminal(host: ReplicaHost, rid: str, path: str, *typing: dict[str, Any]) -> str:
    """What ``typing`` typed into a new focused xterm whose shell writes each line to ``path``."""
    sh(host, rid, f"rm -f {path}; setsid xterm -title typed -e sh -c 'cat > {path}' >/dev/null 2>&1 &")
    for _ in range(60):  # the window is mapped and focused (openbox focuses new windows)
        if "typed" in sh(host, rid, "xdotool getactivewindow getwindowname 2>/dev/null"):
            break
        time.sleep(0.5)
    act(host, rid, *typing)
    for _ in range(40):
        text = sh(host, rid, f"cat {path} 2>/dev/null")
        if text.endswith("\n"):
            break
        time.sleep(0.5)
    sh(host, rid, "pkill -f 'xterm -title typed' || true")
    return text


def test_pyautogui_code_runs_as_the_desktop_user_on_the_display(office: tuple[ReplicaHost, str]) -> None:
    host, rid = office
    w, h = host.image.screen
    [r] = act(
        host, rid, {"type": "pyautogui", "command": "open('/home/user/pg.txt', 'w').write(str(pyautogui.size()))"}
    )
    assert r.ok, r.error
    assert sh(host, rid, "cat /home/user/pg.txt") == f"Size(width={w}, height={h})"
    assert sh(host, rid, "stat -c %U /home/user/pg.txt").strip() == "user"


def test_pyautogui_types_less_than_as_less_than(office: tuple[ReplicaHost, str]) -> None:
    host, rid = office
    code = "pyautogui.typewrite('a<b', interval=0.05); pyautogui.press('enter')"
    assert typed_into_a_fresh_terminal(host, rid, "/tmp/pg-typed", {"type": "pyautogui", "command": code}) == "a<b\n"


def test_computer13_reaches_x_as_input_events(office: tuple[ReplicaHost, str]) -> None:
    host, rid = office
    typing = [
        c13("TYPING", text="x<Y"),
        c13("KEY_DOWN", key="shift"),
        c13("PRESS", key="1"),
        c13("KEY_UP", key="shift"),
    ]
    typed = typed_into_a_fresh_terminal(host, rid, "/tmp/c13-typed", *typing, c13("PRESS", key="enter"))
    assert typed == "x<Y!\n"
    [r] = act(host, rid, c13("MOVE_TO", x=101.4, y=57))
    assert r.ok and sh(host, rid, "xdotool getmouselocation --shell | head -2").split() == ["X=101", "Y=57"]


def test_code_that_raises_or_overruns_fails_its_action_and_the_replica_goes_on(office: tuple[ReplicaHost, str]) -> None:
    host, rid = office
    start = time.monotonic()
    raised, overran, after = act(
        host,
        rid,
        {"type": "pyautogui", "command": "raise RuntimeError('agent bug')"},
        {"type": "pyautogui", "command": "time.sleep(120)", "timeout": 3},
        {"type": "pyautogui", "command": "print('still here')"},
    )
    assert not raised.ok and raised.error == "the code failed: RuntimeError: agent bug"
    assert not overran.ok and "timed out after 3 s" in (overran.error or "")
    assert after.ok and after.stdout == "still here\n"
    assert time.monotonic() - start < 60
    assert "sleep" not in sh(host, rid, "ps -u user -o args | grep -v grep | grep 'time.sleep(120)' || true")


def test_the_observation_carries_osworlds_tree_and_the_pointer(office: tuple[ReplicaHost, str]) -> None:
    host, rid = office
    rec, lease = host.lease("t")
    assert rec.id == rid  # the only replica of this host
    leased = LeasedHost(host, Claim(lease.owner, lease.id, rec.generation))
    try:
        seen = observe(leased, rid, include=("accessibility_tree", "terminal", "cursor"))
        assert seen.unavailable is None, seen.unavailable
        assert seen.accessibility_tree is not None and seen.accessibility_tree.startswith("<desktop-frame")
        # the pointer is drawn into the screen: the patch under it changes when it moves away
        w, h = host.image.screen
        x, y = w // 2, h - 40
        act(host, rid, {"type": "move", "x": x, "y": y})
        time.sleep(0.5)
        here = host.capture.grab(host.get(rid).domain).crop((x, y, x + 12, y + 18))
        act(host, rid, {"type": "move", "x": 5, "y": 5})
        time.sleep(0.5)
        gone = host.capture.grab(host.get(rid).domain).crop((x, y, x + 12, y + 18))
        assert ImageChops.difference(here, gone).getbbox() is not None
    finally:
        host.release(rid, lease.id)
