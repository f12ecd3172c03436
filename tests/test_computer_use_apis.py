"""Anthropic's computer toolset and OpenAI's computer actions on osfleet, offline: the vendors' own SDKs (their
``tool_result``, ``agents.AsyncComputer``, the ``computer_call`` item as ``openai`` parses it) drive osfleet's client
over HTTP into a real host agent whose actions run through osfleet's real action runner; only the desktop under it
is a stand-in (tests/scripted_guest.py: the input events and guest commands are recorded). No vendor's API is
called (no key is needed); tests/test_computer_use_apis_vm.py runs the same on a real replica."""

from __future__ import annotations

import asyncio
import base64
import importlib
import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agents
import pytest
from anthropic.tools import ToolError, ToolsetConfigError
from anthropic.tools.computer import BetaAbstractComputerToolset20260801, BetaAsyncAbstractComputerToolset20260801
from anthropic.types.beta import BetaToolUseBlock
from openai.types.responses import ResponseComputerToolCall
from PIL import Image

from osfleet.client import AsyncFleet, Fleet, FleetError, InvalidActionError
from osfleet.client.anthropic import AsyncComputerToolset, ComputerTool20251124, ComputerToolset
from osfleet.client.openai import AsyncComputer, Computer, computer_call_output, desktop_provider
from tests.scripted_guest import SCREEN, DesktopHost, ScriptedGuest
from tests.test_fleet import Agent, free_port

pytestmark = pytest.mark.integration  # in-process, but a server on loopback and seconds in sum

SHOWN = (1429, 804)  # 1920x1080 within 1.15 megapixels
TOKEN = "token-apis"
NOTE = "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt\n"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent("apis", DesktopHost(tmp_path / "apis", ready=2), free_port())
    a.start()
    yield a
    a.stop()


@pytest.fixture
def desk(agent: Agent) -> Iterator[tuple[Any, ScriptedGuest]]:
    with Fleet(f"http://127.0.0.1:{agent.port}", "token-apis") as fleet, fleet.lease("apis") as session:
        yield session, agent.host.guest  # type: ignore[attr-defined]


def use(toolset: Any, name: str, **given: Any) -> dict[str, Any]:
    block = BetaToolUseBlock(type="tool_use", id=f"toolu_{name}", name=name, input=given, toolset_name="computer")
    return dict(toolset.tool_result(block))


def text_of(result: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict))


def image_of(result: dict[str, Any]) -> Image.Image:
    [block] = [c for c in result["content"] if c["type"] == "image"]
    return Image.open(io.BytesIO(base64.b64decode(block["source"]["data"])))


# --- Anthropic -----------------------------------------------------------------------------------------------------
def test_the_toolset_is_the_sdks_and_serves_all_17_members(desk: tuple[Any, ScriptedGuest]) -> None:
    session, _ = desk
    toolset = ComputerToolset(session, confirm=lambda context: True)
    assert isinstance(toolset, BetaAbstractComputerToolset20260801)
    assert toolset.to_dict() == {"type": "computer_toolset_20260801"}  # no member sent as disabled
    with pytest.raises(ToolsetConfigError, match="requires a confirm callable"):  # the SDK's own rule
        ComputerToolset(session)


def test_screenshots_fit_the_models_limit_and_points_map_back_to_the_desktop(desk: tuple[Any, ScriptedGuest]) -> None:
    session, guest = desk
    toolset = ComputerToolset(session, confirm=lambda context: True)
    shot = use(toolset, "screenshot")
    assert shot["toolset_name"] == "computer" and not shot.get("is_error")
    image = image_of(shot)
    assert image.size == SHOWN and image.getpixel((10, 10)) == (255, 0, 0)
    clicked = use(toolset, "left_click", coordinate=[714, 402], text="ctrl")
    assert not clicked.get("is_error"), clicked
    assert guest.timeline()[-5:] == ["+ctrl", "@960,540", "B+left", "B-left", "-ctrl"]  # the model pixel's centre
    assert text_of(use(toolset, "cursor_position")) == "X=714,Y=402"  # back in the screenshot's pixels
    zoom = image_of(use(toolset, "zoom", region=[0, 0, 714, 402]))
    assert zoom.size == SHOWN and zoom.getpixel((SHOWN[0] - 1, SHOWN[1] - 1))[0] > 200  # the red quarter, enlarged


def test_a_screenshot_that_needs_no_scaling_is_an_observation_not_a_step(desk: tuple[Any, ScriptedGuest]) -> None:
    session, _ = desk
    toolset = ComputerToolset(session, confirm=lambda context: True, max_long_side=None, max_pixels=None)
    assert image_of(use(toolset, "screenshot")).size == SCREEN
    assert session.steps == 0  # nothing recorded on the host for a look at the screen


def test_every_acting_member_reaches_the_desktop(desk: tuple[Any, ScriptedGuest]) -> None:
    session, guest = desk
    toolset = ComputerToolset(session, confirm=lambda context: True)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("mouse_move", {"coordinate": [100, 100]}),
        ("left_mouse_down", {}),
        ("left_mouse_up", {}),
        ("right_click", {}),
        ("middle_click", {"coordinate": [0, 0]}),
        ("double_click", {"coordinate": [0, 0]}),
        ("triple_click", {"coordinate": [0, 0], "text": "shift"}),
        ("left_click_drag", {"start_coordinate": [0, 0], "coordinate": [10, 0]}),
        ("scroll", {"scroll_direction": "left", "scroll_amount": 2}),
        ("scroll", {"coordinate": [5, 5], "scroll_direction": "down", "scroll_amount": 60}),
        ("key", {"text": "ctrl+shift+Escape"}),
        ("key", {"text": "Return", "repeat": 2}),
        ("key", {"text": "ctrl+a Delete"}),
        ("hold_key", {"text": "shift", "duration": 0}),
        ("type", {"text": "é"}),
        ("wait", {"duration": 0}),
    ]
    for name, given in calls:
        result = use(toolset, name, **given)
        assert not result.get("is_error"), (name, result)
    words = guest.timeline()
    assert "@135,135" in words and words.count("B+right") == 1 and words.count("B+middle") == 1
    assert words.count("B+wheel-down") == 60 and any(
        c.endswith("click --repeat 2 --delay 10 6") for c in guest.commands
    )
    assert words.count("+ret") == 2 and "+esc" in words and "+delete" in words
    assert any("xmodmap" in c and "U00E9" in c for c in guest.commands)


@pytest.mark.parametrize(
    ("name", "given", "reason"),
    [
        ("left_click", {"coordinate": [5000, 10]}, r"left_click: \(5000, 10\) is off the 1429x804 screen"),
        ("mouse_move", {"coordinate": [-1, 3]}, "is off the 1429x804 screen"),
        ("zoom", {"region": [0, 0, 2000, 10]}, r"region \[0, 0, 2000, 10\] is not inside the 1429x804 screen"),
        ("key", {"text": "ctrl+Hyper_Q"}, "unknown key 'Hyper_Q'"),
        (
            "scroll",
            {"scroll_direction": "sideways", "scroll_amount": 1},
            "Input should be 'up', 'down', 'left' or 'right'",
        ),
        ("hold_key", {"text": "shift", "duration": 3600}, "less than or equal to 60"),
        ("type", {"text": "bell\x07"}, r"cannot type '\\x07'"),
    ],
)
def test_what_the_desktop_cannot_do_is_an_error_the_model_reads(
    desk: tuple[Any, ScriptedGuest], name: str, given: dict[str, Any], reason: str
) -> None:
    session, guest = desk
    toolset = ComputerToolset(session, confirm=lambda context: True)
    before = list(guest.events)
    result = use(toolset, name, **given)
    assert result["is_error"] is True and result["toolset_name"] == "computer"
    assert re.search(reason, text_of(result)), text_of(result)
    assert guest.events == before  # nothing reached the desktop, nothing was clamped onto it


def test_a_declined_confirmation_types_nothing(desk: tuple[Any, ScriptedGuest]) -> None:
    session, guest = desk
    toolset = ComputerToolset(session, confirm=lambda context: context.member != "type")
    result = use(toolset, "type", text="rm -rf ~\n")
    assert result["is_error"] is True and guest.events == []


def test_the_older_computer_20251124_tool_speaks_the_same(desk: tuple[Any, ScriptedGuest]) -> None:
    session, guest = desk
    tool = ComputerTool20251124(session, confirm=lambda action, given: action != "key")
    spec = tool.to_dict()
    assert spec["type"] == "computer_20251124" and (spec["display_width_px"], spec["display_height_px"]) == SHOWN
    assert tool.call({"action": "left_click", "coordinate": [10, 10]}) == [{"type": "text", "text": "Clicked."}]
    [shot] = tool.call({"action": "screenshot"})
    assert Image.open(io.BytesIO(base64.b64decode(shot["source"]["data"]))).size == SHOWN
    with pytest.raises(ToolError, match="is off the 1429x804 screen"):
        tool.call({"action": "left_click", "coordinate": [1429, 0]})
    with pytest.raises(ToolError, match="key was declined"):
        tool.call({"action": "key", "text": "Return"})
    assert "+ret" not in guest.timeline()


def test_the_async_toolset_answers_the_same(agent: Agent) -> None:
    async def go() -> list[dict[str, Any]]:
        async with AsyncFleet(f"http://127.0.0.1:{agent.port}", TOKEN) as fleet, fleet.lease("apis") as session:
            toolset = AsyncComputerToolset(session, confirm=lambda context: True)
            assert isinstance(toolset, BetaAsyncAbstractComputerToolset20260801)
            out = []
            for name, given in (
                ("screenshot", {}),
                ("type", {"text": "hi"}),
                ("left_click", {"coordinate": [9999, 0]}),
            ):
                block = BetaToolUseBlock(type="tool_use", id="t", name=name, input=given, toolset_name="computer")
                out.append(dict(await toolset.tool_result(block)))
            return out

    shot, typed, off = asyncio.run(go())
    assert image_of(shot).size == SHOWN and not typed.get("is_error") and off["is_error"] is True


# --- OpenAI ---------------------------------------------------------------------------------------------------------
def test_the_async_computer_is_openai_agents_and_acts_on_the_desktop(agent: Agent) -> None:
    async def go() -> tuple[str, tuple[int, int] | None]:
        async with AsyncFleet(f"http://127.0.0.1:{agent.port}", TOKEN) as fleet, fleet.lease("apis") as session:
            c = AsyncComputer(session)
            assert isinstance(c, agents.AsyncComputer) and c.environment == "ubuntu"
            await c.click(200, 200, "left")
            await c.click(10, 10, "back", keys=["ctrl"])
            await c.double_click(20, 20)
            await c.type(NOTE)
            await c.keypress(["CTRL", "ArrowLeft"])
            await c.scroll(30, 30, scroll_x=-250, scroll_y=120)
            await c.move(40, 40)
            await c.drag([(1, 1), (50, 1), (50, 50)], keys=["shift"])
            return await c.screenshot(), c.dimensions

    shot, dims = asyncio.run(go())
    assert Image.open(io.BytesIO(base64.b64decode(shot))).size == SCREEN and dims == SCREEN
    words = agent.host.guest.timeline()  # type: ignore[attr-defined]
    assert words[:3] == ["@200,200", "B+left", "B-left"]
    assert words[3:8] == ["+ctrl", "@10,10", "B+side", "B-side", "-ctrl"]
    assert words.count("B+wheel-down") == 1  # pixels as wheel clicks, and 250 to the left as two (by the guest):
    assert agent.host.guest.commands[-1].endswith("click --repeat 2 --delay 10 6")  # type: ignore[attr-defined]
    assert "+left" in words and words[-3:] == ["@50,50", "B-left", "-shift"]


def test_the_async_computer_takes_a_blocking_session_too(desk: tuple[Any, ScriptedGuest]) -> None:
    """A script with a blocking ``Session`` awaits the computer from an event loop of its own (asyncio.run): the
    session's calls run on the session's loop."""
    session, guest = desk

    async def go() -> str:
        c = AsyncComputer(session)
        await c.click(30, 40, "right")
        await c.keypress(["ENTER"])
        return await c.screenshot()

    shot = asyncio.run(go())
    assert Image.open(io.BytesIO(base64.b64decode(shot))).size == SCREEN
    assert guest.timeline() == ["@30,40", "B+right", "B-right", "+ret", "-ret"]


def test_a_ga_computer_call_is_run_in_order_and_answered_with_a_screenshot(desk: tuple[Any, ScriptedGuest]) -> None:
    session, guest = desk
    item = {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "call_1",
        "status": "completed",
        "pending_safety_checks": [],
        "actions": [
            {"type": "click", "x": 200, "y": 200, "button": "left"},
            {"type": "type", "text": "ok"},
            {"type": "keypress", "keys": ["ENTER"]},
            {"type": "screenshot"},
        ],
    }
    for call in (item, ResponseComputerToolCall.model_validate(item)):  # as a dict, and as openai parses it
        out = computer_call_output(session, call)
        assert out["type"] == "computer_call_output" and out["call_id"] == "call_1"
        assert out["output"]["type"] == "computer_screenshot"
        url = out["output"]["image_url"]
        assert url.startswith("data:image/png;base64,")
        assert Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size == SCREEN
    downs = [w for w in guest.timeline() if w.startswith(("+", "B+"))]
    assert downs == ["B+left", "+o", "+k", "+ret"] * 2


def test_a_computer_call_with_pending_safety_checks_waits_for_a_person(desk: tuple[Any, ScriptedGuest]) -> None:
    session, guest = desk
    check = {"id": "sc_1", "code": "malicious_instructions", "message": "the page asks for a password"}
    item = {"type": "computer_call", "call_id": "call_2", "pending_safety_checks": [check], "actions": [
        {"type": "type", "text": "hunter2"}]}  # fmt: skip
    with pytest.raises(FleetError, match="pending safety checks \\(malicious_instructions\\)"):
        computer_call_output(session, item)
    assert guest.events == []
    out = computer_call_output(session, item, acknowledge_safety_checks=True)
    assert out["acknowledged_safety_checks"] == [check] and guest.events


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ({"type": "click", "x": 1920, "y": 5, "button": "left"}, r"click: \(1920, 5\) is off the 1920x1080 screen"),
        ({"type": "click", "x": 5, "y": 5, "button": "thumb"}, "unknown button 'thumb'"),
        ({"type": "keypress", "keys": ["CTRL", "NOPE"]}, "unknown key 'NOPE'"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}]}, "at least two points"),
        ({"type": "zoom"}, "'zoom' is not one of OpenAI's computer actions"),
    ],
)
def test_a_computer_call_the_desktop_cannot_do_raises_the_reason(
    desk: tuple[Any, ScriptedGuest], action: dict[str, Any], reason: str
) -> None:
    session, guest = desk
    with pytest.raises(InvalidActionError, match=reason):
        computer_call_output(session, {"type": "computer_call", "call_id": "c", "actions": [action]})
    assert guest.events == []


def test_the_sync_computer_and_the_provider_lease_per_run(agent: Agent) -> None:
    with Fleet(f"http://127.0.0.1:{agent.port}", TOKEN) as fleet, fleet.lease("apis") as session:
        c = Computer(session)
        assert isinstance(c, agents.Computer) and c.dimensions == SCREEN
        c.click(5, 5, "wheel")
        assert agent.host.guest.timeline()[-2:] == ["B+middle", "B-middle"]  # type: ignore[attr-defined]

    def leased() -> int:
        return sum(1 for r in agent.host.replicas() if r.lease is not None)

    async def run() -> None:
        async with AsyncFleet(f"http://127.0.0.1:{agent.port}", TOKEN) as fleet:
            provider = desktop_provider(fleet, holder="run-1")
            assert isinstance(provider, agents.ComputerProvider)
            computer = await provider.create(run_context=None)
            assert isinstance(computer, AsyncComputer) and computer.dimensions == SCREEN and leased() == 1
            assert provider.dispose is not None
            await provider.dispose(run_context=None, computer=computer)
            assert leased() == 0

    asyncio.run(run())


def test_a_missing_sdk_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for sdk, module, extra in (
        ("anthropic", "osfleet.client.anthropic", "anthropic"),
        ("agents", "osfleet.client.openai", "openai"),
    ):
        for name in [m for m in sys.modules if m == sdk or m.startswith(f"{sdk}.")]:
            monkeypatch.setitem(sys.modules, name, None)  # import of the SDK fails, as where it is not installed
        monkeypatch.delitem(sys.modules, module)
        with pytest.raises(ImportError) as caught:
            importlib.import_module(module)
        message = str(caught.value)
        assert "\n" not in message and f"pip install 'osfleet[{extra}]'" in message, message
