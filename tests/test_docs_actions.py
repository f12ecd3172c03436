"""The action-space guide's examples are actions the server takes: every JSON block of
``docs/how-to/action-spaces.md`` is validated with the models a step is validated with (``ACTIONS``), so a
renamed field or a dropped action cannot leave the page teaching what is refused."""

from __future__ import annotations

import json
import re

import pytest

from osfleet.protocol.actions import ACTIONS, Computer13, PyAutoGUI
from osfleet.replicas.actions import declares_infeasible, ends_episode
from tests.conftest import REPO

pytestmark = pytest.mark.unit

PAGE = REPO / "docs" / "how-to" / "action-spaces.md"
JSON_BLOCK = re.compile(r"^```json\n(.*?)^```", re.S | re.M)


def blocks() -> list[list[dict[str, object]]]:
    return [json.loads(b) for b in JSON_BLOCK.findall(PAGE.read_text())]


def test_every_example_on_the_page_is_a_valid_step() -> None:
    found = blocks()
    assert len(found) == 3  # osfleet's own, pyautogui, computer_13
    for block in found:
        ACTIONS.validate_python(block)  # raises on any action the server would refuse


def test_the_page_shows_all_16_computer_13_actions_and_the_episode_enders() -> None:
    actions = [a for block in blocks() for a in ACTIONS.validate_python(block)]
    kinds = {a.action.action_type for a in actions if isinstance(a, Computer13)}
    documented = {"MOVE_TO", "CLICK", "MOUSE_DOWN", "MOUSE_UP", "DRAG_TO", "SCROLL", "TYPING", "PRESS", "KEY_DOWN",
                  "KEY_UP", "HOTKEY", "WAIT", "DONE"}  # fmt: skip
    assert documented <= kinds
    named = set(re.findall(r"`([A-Z_0-9]+)`", PAGE.read_text()))  # the others are explained in the prose
    assert {"RIGHT_CLICK", "DOUBLE_CLICK", "FAIL"} <= named
    enders = [a for a in actions if ends_episode(a)]
    assert {a.type for a in enders} == {"terminate", "pyautogui", "computer_13"}
    assert not any(declares_infeasible(a) for a in enders)  # the examples end with success; FAIL is in the prose
    assert any(isinstance(a, PyAutoGUI) and a.command == "WAIT" for a in actions)
