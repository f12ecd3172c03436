"""The input primitives of osfleet's action model (no VM: QEMU's monitor and the guest's commands are recorded; the
same actions on a real replica are in tests/test_input_primitives_vm.py): clicks at the pointer with a count and
modifiers, back/forward buttons, both scroll axes, mouse and key down/up, held keys, drags along a path for a
time, the pointer's position, Unicode text through spare keys, region screenshots scaled as asked, and bad input
refused before anything reaches the guest."""

from __future__ import annotations

import base64
import io
import re
import time
from typing import Any

import pytest
from PIL import Image

from osfleet.errors import OsfleetError
from osfleet.protocol.actions import ACTIONS, ActionResult
from osfleet.replicas import keyboard_flow, unicode_keys
from osfleet.replicas.actions import run_actions
from osfleet.replicas.input import Input, InputError
from tests.scripted_guest import SIZE, ScriptedGuest

pytestmark = pytest.mark.unit


_domains = iter(range(10**6))


def run(guest: ScriptedGuest, *actions: dict[str, Any], capture: Any = None, domain: str = "") -> list[ActionResult]:
    domain = domain or f"osfleet-prim-{id(guest)}-{next(_domains)}"
    return run_actions(guest, domain, SIZE, ACTIONS.validate_python(list(actions)), capture=capture)  # type: ignore[arg-type]


def test_a_click_at_the_pointer_with_a_count_and_modifiers_held_around_it() -> None:
    g = ScriptedGuest()
    [r] = run(g, {"type": "click", "count": 3, "keys": ["ctrl", "Shift_L"]})
    assert r.ok, r.error
    clicks = ["B+left", "B-left"] * 3
    assert g.timeline() == ["+ctrl", "+shift", *clicks, "-shift", "-ctrl"]  # no move: where the pointer is
    g = ScriptedGuest()
    run(
        g,
        {"type": "click", "x": 10, "y": 20, "button": "back"},
        {"type": "click", "x": 10, "y": 20, "button": "forward"},
    )
    assert g.timeline() == ["@10,20", "B+side", "B-side", "@10,20", "B+extra", "B-extra"]
    g = ScriptedGuest()
    run(g, {"type": "right_click", "keys": ["alt"]}, {"type": "double_click", "x": 5, "y": 6})
    assert g.timeline() == ["+alt", "B+right", "B-right", "-alt", "@5,6", "B+left", "B-left", "B+left", "B-left"]


def test_scrolls_both_ways_at_a_point_or_the_pointer() -> None:
    g = ScriptedGuest()
    run(
        g,
        {"type": "scroll", "clicks": -2, "clicks_x": 1},
        {"type": "scroll", "x": 1, "y": 2, "clicks_x": -1, "keys": ["shift"]},
    )
    up = ["B+wheel-up", "B-wheel-up"]
    assert g.timeline() == up * 2 + ["+shift", "@1,2", "-shift"]
    # sideways through the guest's X server (QEMU 7.2's tablet has no horizontal wheel): right, then left
    assert [c.split("&& ")[-1] for c in g.commands] == [
        "exec xdotool click --repeat 1 --delay 10 7",
        "exec xdotool click --repeat 1 --delay 10 6",
    ]
    assert g.log.index(g.commands[1]) < len(g.log) - 1  # the left scroll ran while shift was held


def test_mouse_and_keys_down_and_up_apart_and_keys_held_for_a_time() -> None:
    g = ScriptedGuest()
    results = run(
        g,
        {"type": "mouse_down", "x": 7, "y": 8, "button": "middle"},
        {"type": "mouse_up", "button": "middle"},
        {"type": "key_down", "key": "Control_L"},
        {"type": "key_down", "key": "plus"},  # X's name of a shifted character: shift around it
        {"type": "key_up", "key": "plus"},
        {"type": "key_up", "key": "ctrl"},
        {"type": "hotkey", "keys": ["ctrl", "Page_Down"]},
        {"type": "hotkey", "keys": ["ArrowLeft"]},
    )
    assert all(r.ok for r in results)
    assert g.timeline() == [
        "@7,8", "B+middle", "B-middle",
        "+ctrl", "+shift", "+equal", "-shift", "-equal", "-ctrl",
        "+ctrl", "+pgdn", "-pgdn", "-ctrl", "+left", "-left",
    ]  # fmt: skip
    g = ScriptedGuest()
    start = time.monotonic()
    [r] = run(g, {"type": "hold_key", "keys": ["shift", "a"], "seconds": 0.3})
    assert r.ok and 0.3 <= time.monotonic() - start < 2
    assert g.timeline() == ["+shift", "+a", "-a", "-shift"]


def test_a_drag_follows_its_path_for_its_time_and_lets_go_whatever_happens() -> None:
    g = ScriptedGuest()
    start = time.monotonic()
    path = [[10, 10], [50, 10], [50, 60], [90, 60]]
    [r] = run(g, {"type": "drag", "path": path, "seconds": 0.6, "button": "right", "keys": ["alt"]})
    took = time.monotonic() - start
    assert r.ok and 0.6 <= took < 2.0
    assert g.timeline() == ["+alt", "@10,10", "B+right", "@50,10", "@50,60", "@90,60", "B-right", "-alt"]
    g = ScriptedGuest()
    run(g, {"type": "drag", "x1": 0, "y1": 0, "x2": 80, "y2": 0})  # the old form: a straight line in 8 moves
    assert g.timeline() == ["@0,0", "B+left", *[f"@{10 * i},0" for i in range(1, 9)], "B-left"]

    class FailingMove(ScriptedGuest):
        def qmp(self, domain: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
            if arguments and len(self.events) > 6 and arguments["events"][0]["type"] == "abs":
                raise OsfleetError("QMP input-send-event: monitor busy")
            return super().qmp(domain, command, arguments)

    g = FailingMove()
    [r] = run(g, {"type": "drag", "path": path, "keys": ["ctrl"]})
    assert not r.ok and "monitor busy" in (r.error or "")
    assert g.timeline()[-2:] == ["B-left", "-ctrl"]  # the button and the modifier are let go


def test_the_pointer_position_is_known_without_the_guest_until_the_agents_code_ran() -> None:
    g = ScriptedGuest({"getmouselocation": {"stdout": "X=321\nY=123\nSCREEN=0\nWINDOW=4194\n"}})
    domain = f"osfleet-prim-pointer-{id(g)}"
    [first] = run(g, {"type": "cursor_position"}, domain=domain)  # a new domain: the guest's X server is asked
    assert (first.x, first.y) == (321, 123) and len(g.commands) == 1
    moved, here = run(g, {"type": "move", "x": 40, "y": 50}, {"type": "cursor_position"}, domain=domain)
    assert (here.x, here.y) == (40, 50) and len(g.commands) == 1  # where osfleet put it: no guest command
    clicked = run(
        g,
        {"type": "click", "x": 7, "y": 9},
        {"type": "scroll", "clicks": 1},
        {"type": "cursor_position"},
        domain=domain,
    )
    assert (clicked[-1].x, clicked[-1].y) == (7, 9) and len(g.commands) == 1
    run(g, {"type": "shell", "command": "xdotool mousemove 1 1"}, {"type": "cursor_position"}, domain=domain)
    assert sum("getmouselocation" in c for c in g.commands) == 2  # the agent's code may have moved it: asked again


@pytest.mark.parametrize(
    "answer",
    [
        {"stdout": "X=99999\nY=5\n"},  # off its own screen
        {"stdout": "X=1;rm -rf ~\nY=2\n"},
        {"stdout": "", "exit_code": 1, "stderr": "Can't open display"},
        {"stdout": "X=" + "9" * 100000},
    ],
)
def test_a_guest_that_answers_junk_about_its_pointer_fails_the_action_only(answer: dict[str, Any]) -> None:
    g = ScriptedGuest({"getmouselocation": answer})
    results = run(g, {"type": "cursor_position"}, {"type": "click", "x": 1, "y": 1})
    assert not results[0].ok and results[0].x is None and results[1].ok


def what_x_typed(guest: ScriptedGuest) -> str:
    """The characters the guest's X server made of the spare keys pressed, with its map as xmodmap left it."""
    keycode, mapped, typed = dict(unicode_keys.SPARE_KEYS), {}, []
    for entry in guest.log:
        if isinstance(entry, str):
            mapped |= {int(kc): chr(int(sym, 16)) for kc, sym in re.findall(r"keycode (\d+) = U([0-9A-F]+) ", entry)}
        elif entry["type"] == "key" and entry["data"]["down"] and entry["data"]["key"]["data"] in keycode:
            typed.append(mapped[keycode[entry["data"]["key"]["data"]]])
    return "".join(typed)


def test_unicode_text_goes_through_spare_keys_mapped_once() -> None:
    g = ScriptedGuest()
    domain = f"osfleet-prim-unicode-{id(g)}"
    [r] = run(g, {"type": "type", "text": "Café €5 Ω\n"}, domain=domain)
    assert r.ok, r.error
    [remap] = g.commands
    (first, kc1), (second, kc2), (third, kc3) = unicode_keys.SPARE_KEYS[:3]
    for kc, sym in ((kc1, "U00E9"), (kc2, "U20AC"), (kc3, "U03A9")):
        assert f"keycode {kc} = {sym} {sym}" in remap
    downs = [w[1:] for w in g.timeline() if w.startswith("+")]
    assert downs == ["shift", "c", "a", "f", first, "spc", second, "5", "spc", third, "ret"]
    assert what_x_typed(g) == "é€Ω"
    run(g, {"type": "type", "text": "é€"}, domain=domain)
    assert len(g.commands) == 1  # the keys still carry them: no new remap


def test_a_text_with_more_characters_than_spare_keys_is_typed_in_parts() -> None:
    g = ScriptedGuest()
    greek = "αβγδεζηθικλμνξοπ"  # 16 distinct characters, more than the spare keys
    assert len(set(greek)) > len(unicode_keys.SPARE_KEYS)
    [r] = run(g, {"type": "type", "text": greek + greek[:3]})
    assert r.ok, r.error
    assert len(g.commands) == 2  # two parts; α, β and γ kept their keys for the end
    assert what_x_typed(g) == greek + greek[:3]


def test_plans_reuse_keys_that_carry_a_character_and_spare_those_still_needed() -> None:
    one, two = (code for code, _ in unicode_keys.SPARE_KEYS[:2])
    first = unicode_keys.plan("aé", {})
    assert [p.remap for p in first.parts] == [{one: "é"}] and first.parts[0].text == "aé"
    again = unicode_keys.plan("éü", {one: "é"})
    assert [p.remap for p in again.parts] == [{two: "ü"}]
    full = {code: chr(0x3B1 + i) for i, (code, _) in enumerate(unicode_keys.SPARE_KEYS)}
    needed_later = unicode_keys.plan("ü" + chr(0x3B1), full)  # α (on the first key) is needed after ü
    assert needed_later.parts[0].remap == {two: "ü"} and len(needed_later.parts) == 1
    assert unicode_keys.plan("plain ascii\n", {}).remaps == 0


def test_a_remap_the_guest_refuses_fails_the_typing_and_forgets_the_keys() -> None:
    g = ScriptedGuest({"xmodmap": {"exit_code": 1, "stderr": "xmodmap:  unable to open display ':0'"}})
    domain = f"osfleet-prim-refused-{id(g)}"
    [r] = run(g, {"type": "type", "text": "é"}, domain=domain)
    assert not r.ok and "unable to open display" in (r.error or "") and g.events == []
    assert keyboard_flow.flow_for(domain, lambda: 0).spare == {}


def screen_with_quadrants() -> Image.Image:
    image = Image.new("RGB", SIZE, (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 500, 400))  # the top left quarter is red
    return image


def decoded(r: ActionResult) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(r.content_base64 or "")))


def test_a_region_screenshot_is_cropped_and_scaled_as_asked() -> None:
    g = ScriptedGuest()
    grab = screen_with_quadrants
    whole, region, wide, jpeg = run(
        g,
        {"type": "screenshot"},
        {"type": "screenshot", "region": [0, 0, 500, 400], "width": 250},
        {"type": "screenshot", "width": 500, "height": 100},
        {"type": "screenshot", "region": [500, 400, 1000, 800], "format": "jpeg", "quality": 50},
        capture=grab,
    )
    assert (whole.width, whole.height) == SIZE and decoded(whole).size == SIZE
    assert (region.width, region.height) == (250, 200) and decoded(region).getpixel((125, 100)) == (255, 0, 0)
    assert decoded(wide).size == (500, 100)
    image = decoded(jpeg)
    assert image.format == "JPEG" and image.size == (500, 400) and image.getpixel((250, 200))[2] > 200


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ({"type": "click", "x": 1000, "y": 5}, r"click: coordinates \(1000, 5\) are off the 1000x800 screen"),
        ({"type": "scroll", "x": -1, "y": 5, "clicks": 1}, r"\(-1, 5\) are off"),
        ({"type": "mouse_down", "x": 5, "y": 800}, r"\(5, 800\) are off"),
        ({"type": "drag", "path": [[1, 1], [2, 2], [5000, 3]]}, r"\(5000, 3\) are off"),
        ({"type": "click", "keys": ["hyper"]}, "unknown key 'hyper'"),
        ({"type": "key_down", "key": "nosuchkey"}, "unknown key 'nosuchkey'"),
        ({"type": "hold_key", "keys": ["ctrl", "Blah"], "seconds": 1}, "unknown key 'Blah'"),
        ({"type": "type", "text": "ok\x07"}, r"cannot type '\\x07'"),
        ({"type": "screenshot", "region": [0, 0, 1001, 10]}, r"region \[0, 0, 1001, 10\] is not inside the 1000x800"),
        ({"type": "screenshot", "region": [10, 10, 10, 20]}, "is not inside"),
        ({"type": "screenshot", "region": [0, 0, 1, 800], "width": 4000}, "is not between 1 and 4096"),
    ],
)
def test_what_the_desktop_cannot_do_is_refused_with_the_reason_before_anything_is_sent(
    action: dict[str, Any], reason: str
) -> None:
    g = ScriptedGuest()
    with pytest.raises(InputError, match=reason):
        run(g, {"type": "click", "x": 1, "y": 1}, action, capture=screen_with_quadrants)
    assert g.events == [] and g.commands == []


def test_a_screenshot_without_a_capture_fails_that_action_only() -> None:
    g = ScriptedGuest()
    shot, click = run(g, {"type": "screenshot"}, {"type": "click", "x": 1, "y": 1})
    assert not shot.ok and "cannot take the screen" in (shot.error or "") and click.ok


def test_an_input_without_guest_commands_says_what_it_cannot_do() -> None:
    g = ScriptedGuest()
    pointer = Input(g, f"osfleet-prim-noguest-{id(g)}", SIZE)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="cannot type 'é' here"):
        pointer.type_text("é")
    with pytest.raises(InputError, match="cannot be known here"):
        pointer.position()
