"""OSWorld's action spaces on osfleet (no VM: the guest's input devices and shell are recorded; the same actions on
a real office replica are in tests/test_osworld_actions_vm.py): pyautogui code as OSWorld runs it, computer_13 as
QEMU input events, WAIT/DONE/FAIL, bad input refused by name, the Gymnasium spaces."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from osfleet.api.app import create_app
from osfleet.config import AgentConfig
from osfleet.gym.spaces import actions_in, computer13_space, pyautogui_space, space_for, to_computer13
from osfleet.protocol.actions import ACTIONS
from osfleet.replicas import actions as acts
from osfleet.replicas.actions import declares_infeasible, ends_episode, run_actions
from osfleet.replicas.input import InputError, pyautogui_key
from osfleet.replicas.pyautogui_code import PRELUDE, command_line, fix_less_than
from tests.fakes import FakeHost
from tests.scripted_guest import ScriptedGuest

pytestmark = pytest.mark.unit
TOKEN = "test-token-osworld-spaces"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Guest(ScriptedGuest):
    """A replica's QEMU monitor (input events, a keyboard the guest reads at once) and its guest agent's
    ``guest_exec`` (answers set by the test)."""

    def __init__(self) -> None:
        super().__init__()
        self.execs: list[list[str]] = []
        self.answer: tuple[int, str, str] = (0, "", "")

    def guest_exec(self, domain: str, argv: list[str], timeout: float) -> tuple[int, str, str]:
        self.execs.append(argv)
        return self.answer

    def pressed(self) -> list[tuple[str, bool]]:
        return [(e["data"]["key"]["data"], e["data"]["down"]) for e in self.events if e["type"] == "key"]

    def buttons(self) -> list[tuple[str, bool]]:
        return [(e["data"]["button"], e["data"]["down"]) for e in self.events if e["type"] == "btn"]

    def moves(self) -> list[int]:
        return [e["data"]["value"] for e in self.events if e["type"] == "abs"]


def run(guest: Guest, *actions: dict[str, Any], size: tuple[int, int] = (1000, 800)) -> list[acts.ActionResult]:
    return run_actions(guest, f"osfleet-c13-{id(guest)}", size, ACTIONS.validate_python(list(actions)))  # type: ignore[arg-type]


def c13(action_type: str, **parameters: Any) -> dict[str, Any]:
    return {"type": "computer_13", "action": {"action_type": action_type, "parameters": parameters}}


# --- computer_13 ---------------------------------------------------------------------------------------------------
def test_computer13_clicks_where_asked_or_where_the_pointer_is() -> None:
    g = Guest()
    results = run(g, c13("CLICK", x=999, y=0, button="right", num_clicks=2), c13("CLICK"))
    assert all(r.ok for r in results)
    assert g.moves() == [32767, 0]  # one move, to the far right, top: the second click did not move
    assert g.buttons() == [("right", True), ("right", False)] * 2 + [("left", True), ("left", False)]


def test_computer13_mouse_and_keys_go_down_and_up_separately() -> None:
    g = Guest()
    run(g, c13("MOUSE_DOWN", button="middle"), c13("MOVE_TO", x=10.4, y=20.6), c13("MOUSE_UP", button="middle"))
    assert g.buttons() == [("middle", True), ("middle", False)]
    g = Guest()
    run(g, c13("KEY_DOWN", key="ctrlleft"), c13("PRESS", key="A"), c13("KEY_UP", key="ctrlleft"))
    ctrl, shift = [("ctrl", True), ("ctrl", False)], [("shift", True), ("shift", False)]
    assert g.pressed() == [ctrl[0], shift[0], ("a", True), ("a", False), shift[1], ctrl[1]]


def test_computer13_hotkey_scroll_drag_and_typing() -> None:
    g = Guest()
    run(g, c13("HOTKEY", keys=["ctrl", "shift", "t"]))
    down = [("ctrl", True), ("shift", True), ("t", True)]
    assert g.pressed() == down + [(k, False) for k, _ in reversed(down)]
    g = Guest()
    run(g, c13("SCROLL", dx=2, dy=3))  # pyautogui: dy > 0 scrolls up, dx > 0 right
    assert g.buttons() == [("wheel-up", True), ("wheel-up", False)] * 3
    assert g.execs[0][-1].endswith("xdotool click --repeat 2 --delay 10 7")  # sideways: X's button 7, in the guest
    g = Guest()
    run(g, c13("DRAG_TO", x=500, y=400))
    assert g.buttons() == [("left", True), ("left", False)] and g.moves() == [round(500 * 32767 / 999), 16404]
    g = Guest()
    run(g, c13("TYPING", text="a<B"))
    assert [k for k, down in g.pressed() if down] == ["a", "shift", "comma", "shift", "b"]


def test_computer13_wait_done_fail_and_osworlds_own_forms() -> None:
    given = ACTIONS.validate_python(
        [
            {"type": "computer_13", "action": "WAIT"},
            {"type": "computer_13", "action": {"action_type": "PRESS", "key": "enter"}},  # parameters inline
            {"type": "computer_13", "action": {"action_type": "DONE"}},
            {"type": "computer_13", "action": "FAIL"},
        ]
    )
    assert [ends_episode(a) for a in given] == [False, False, True, True]
    assert [declares_infeasible(a) for a in given] == [False, False, False, True]
    g = Guest()
    assert all(r.ok for r in run(g, {"type": "computer_13", "action": "DONE"}))
    assert g.events == [] and g.execs == []


@pytest.mark.parametrize(
    ("action", "named"),
    [
        ({"type": "teleport"}, "Input tag 'teleport' found using 'type'"),
        (c13("TELEPORT"), "Input tag 'TELEPORT' found using 'action_type'"),
        (c13("CLICK", x=5), "give both x and y"),
        (c13("CLICK", x=5, y=5, button="side"), "'left', 'right' or 'middle'"),
        (c13("TYPING"), "Field required"),
        ({"type": "computer_13", "action": {"action_type": "CLICK", "parameters": {"x": "5", "y": 1}}}, "number"),
    ],
)
def test_unknown_or_malformed_osworld_actions_are_refused_by_name(action: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        ACTIONS.validate_python([action])


@pytest.mark.parametrize(
    ("action", "named"),
    [
        (c13("CLICK", x=1000, y=5), r"\(1000, 5\) is off the 1000x800 screen"),
        (c13("PRESS", key="fn"), "unknown key 'fn'"),
        (c13("HOTKEY", keys=["ctrl", "hyper"]), "unknown key 'hyper'"),
        (c13("TYPING", text="ok\x1b"), r"cannot type '\\x1b'"),
    ],
)
def test_computer13_that_cannot_be_sent_is_refused_before_anything_is(action: dict[str, Any], named: str) -> None:
    g = Guest()
    with pytest.raises(InputError, match=named):
        run(g, {"type": "computer_13", "action": {"action_type": "MOVE_TO", "parameters": {"x": 1, "y": 1}}}, action)
    assert g.events == []


def test_pyautogui_key_names_map_to_the_keyboard() -> None:
    assert pyautogui_key("enter") == ("ret", False) and pyautogui_key("Enter") == ("ret", False)
    assert pyautogui_key("num5") == ("kp_5", False) and pyautogui_key("winleft") == ("meta_l", False)
    assert pyautogui_key("!") == ("1", True) and pyautogui_key("\n") == ("ret", False)


# --- pyautogui -------------------------------------------------------------------------------------------------
def test_pyautogui_code_runs_as_osworld_runs_it_as_the_desktop_user() -> None:
    g = Guest()
    g.answer = (0, "Size(width=1000, height=800)\n", "")
    [r] = run(g, {"type": "pyautogui", "command": "print(pyautogui.size())"})
    assert r.ok and r.exit_code == 0 and r.stdout == "Size(width=1000, height=800)\n"
    argv = g.execs[0]
    assert argv[:3] == ["/usr/bin/timeout", "-s", "KILL"] and "-u" in argv and "user" in argv and "DISPLAY=:0" in argv
    assert argv[-1].endswith(command_line("print(pyautogui.size())"))
    code = shlex.split(argv[-1])[-1]
    assert shlex.split(argv[-1])[-3:-1] == ["python3", "-c"]
    assert code == PRELUDE + "print(pyautogui.size())"  # pyautogui and time imported, FAILSAFE off


def test_pyautogui_code_that_raises_fails_that_action_with_its_error_and_output() -> None:
    g = Guest()
    g.answer = (1, "half\n", "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n")
    r1, r2 = run(g, {"type": "pyautogui", "command": "print('half'); 1/0"}, {"type": "wait", "seconds": 0})
    assert not r1.ok and r1.error == "the code failed: ZeroDivisionError: division by zero"
    assert r1.stdout == "half\n" and r1.exit_code == 1
    assert r2.ok  # the rest of the step goes on


def test_pyautogui_code_that_runs_past_its_deadline_is_killed_and_fails_that_action() -> None:
    g = Guest()
    g.answer = (137, "", "")  # the guest's timeout -s KILL
    [r] = run(g, {"type": "pyautogui", "command": "time.sleep(600)", "timeout": 2})
    assert not r.ok and "timed out after 2 s and was killed" in (r.error or "")
    assert g.execs[0][3] == "2.000"


def test_pyautogui_wait_done_fail_are_osworlds_special_strings() -> None:
    g = Guest()
    results = run(g, *({"type": "pyautogui", "command": c} for c in ("DONE", " FAIL ")))
    assert all(r.ok for r in results) and g.execs == []
    given = ACTIONS.validate_python([{"type": "pyautogui", "command": c} for c in ("WAIT", "DONE", "FAIL", "x=1")])
    assert [ends_episode(a) for a in given] == [False, True, True, False]
    assert [declares_infeasible(a) for a in given] == [False, False, True, False]


@pytest.mark.parametrize(
    ("code", "fixed"),
    [
        ("pyautogui.press('<')", "pyautogui.hotkey('shift', ',')"),
        (
            "pyautogui.typewrite('a<b', interval=0.1)",
            "(pyautogui.typewrite('a', interval=0.1), pyautogui.hotkey('shift', ','), "
            "pyautogui.typewrite('b', interval=0.1),)",
        ),
        ('pyautogui.write("\\u003c")', "(pyautogui.hotkey('shift', ','),)"),
        (
            "for i in range(2): pyautogui.write('x<')",
            "for i in range(2): (pyautogui.write('x'), pyautogui.hotkey('shift', ','),)",
        ),
        ("if 1 < 2: pyautogui.typewrite('no')", "if 1 < 2: pyautogui.typewrite('no')"),
        ("pyautogui.typewrite(text)", "pyautogui.typewrite(text)"),
        ("pyautogui.typewrite('<' ", "pyautogui.typewrite('<' "),  # a syntax error is Python's to report
    ],
)
def test_less_than_is_typed_with_shift_comma_as_osworld_fixes_it(code: str, fixed: str) -> None:
    assert fix_less_than(code) == fixed


def test_a_step_budget_cuts_pyautogui_code_too() -> None:
    g = Guest()
    given = ACTIONS.validate_python([{"type": "pyautogui", "command": "x", "timeout": 600}])
    run_actions(g, "osfleet-budget", (100, 100), given, budget=5.0)  # type: ignore[arg-type]
    assert float(g.execs[0][3]) <= 5.0


# --- through the API ---------------------------------------------------------------------------------------------
@pytest.fixture
def client(tmp_path: Path) -> Any:
    fake = FakeHost(tmp_path, ready=0)
    fake.up_async(1)
    config = AgentConfig(token=TOKEN, warm=0)
    with TestClient(create_app(config, lambda: fake)) as c:
        yield c


def _lease(client: TestClient) -> tuple[str, str]:
    r = client.post("/v1/leases", json={"holder": "t"}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def test_an_unknown_action_type_or_computer13_action_is_a_422_naming_it(client: TestClient) -> None:
    rid, lid = _lease(client)
    for action, named in (
        ({"type": "telekinesis"}, "'telekinesis'"),
        (c13("TELEPORT"), "'TELEPORT'"),
    ):
        body = {"lease_id": lid, "action_id": "bad", "actions": [action]}
        r = client.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH)
        assert r.status_code == 422 and named in r.json()["error"], r.text


def test_done_and_fail_end_the_episode_and_fail_declares_infeasible(client: TestClient) -> None:
    rid, lid = _lease(client)
    body = {"lease_id": lid, "action_id": "s1", "observe": False, "actions": [{"type": "pyautogui", "command": "WAIT"}]}
    assert client.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH).json()["done"] is False
    body |= {"action_id": "s2", "actions": [{"type": "pyautogui", "command": "FAIL"}]}
    assert client.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH).json()["done"] is True
    body |= {"action_id": "s3", "actions": [c13("DONE")]}
    assert client.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH).json()["done"] is True


def test_an_observation_include_is_checked_and_named(client: TestClient) -> None:
    rid, lid = _lease(client)
    r = client.get(f"/v1/replicas/{rid}/observation", params={"lease_id": lid, "include": "smell"}, headers=AUTH)
    assert r.status_code == 422 and "include" in r.json()["error"]
    body = {"lease_id": lid, "action_id": "o1", "actions": [{"type": "wait", "seconds": 0}]}
    r = client.post(f"/v1/replicas/{rid}/step", json=body | {"observation_include": ["smell"]}, headers=AUTH)
    assert r.status_code == 422 and "observation_include" in r.json()["error"]


# --- Gymnasium ---------------------------------------------------------------------------------------------------
def test_computer13_space_samples_are_valid_actions() -> None:
    space = computer13_space(320, 200)
    space.seed(7)
    seen = set()
    for _ in range(300):
        sample = space.sample()
        action = to_computer13(sample)
        seen.add(action["action_type"])
        [a] = ACTIONS.validate_python(actions_in("computer_13", sample, space) or [])
        acts.check_actions([a], (320, 200))
    assert len(seen) == 16


def test_pyautogui_space_takes_code_and_osworlds_strings() -> None:
    space = space_for("pyautogui", 10, 10)
    assert space.contains("pyautogui.click(1, 2)") and isinstance(pyautogui_space().sample(), str)
    assert actions_in("pyautogui", "DONE", space) == [{"type": "pyautogui", "command": "DONE"}]
    assert actions_in("pyautogui", {"type": "wait", "seconds": 0}, space) == [{"type": "wait", "seconds": 0}]
    assert actions_in("pyautogui", np.int64(3), space) is None
    assert actions_in("computer_13", "FAIL", space_for("computer_13", 10, 10)) == [
        {"type": "computer_13", "action": "FAIL"}
    ]
