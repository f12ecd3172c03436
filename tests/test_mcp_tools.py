"""The MCP server's pointer and keyboard tools, through the ``mcp`` SDK's own client (its in-memory transport, in
this process) in front of a real host agent whose actions run through osfleet's action runner into a scripted guest
(tests/scripted_guest.py): what each tool sends to the desktop and answers, and bad input as a tool error. The
transports, sessions and roles are tests/test_mcp.py's; the desktop's own behaviour tests/test_mcp_vm.py's."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.memory import create_connected_server_and_client_session
from PIL import Image

from osfleet.mcp.server import TOOLS, build
from tests.scripted_guest import DesktopHost, ScriptedGuest
from tests.test_fleet import Agent, free_port

pytestmark = pytest.mark.integration  # in-process, but a server on loopback and seconds in sum


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent("mcptools", DesktopHost(tmp_path / "h", ready=1), free_port())
    a.start()
    yield a
    a.stop()


def calls(agent: Agent, *tools: tuple[str, dict[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
    """Each tool called in turn in one MCP session; its results, and the tools' input schemas."""

    async def run() -> tuple[list[Any], dict[str, Any]]:
        server = build(agent.entry.url, agent.entry.token)
        async with create_connected_server_and_client_session(server) as s:
            schemas = {t.name: t.inputSchema for t in (await s.list_tools()).tools}
            return [await s.call_tool(name, given) for name, given in tools], schemas

    return asyncio.run(run())


def text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_the_pointer_and_keyboard_tools_reach_the_desktop(agent: Agent) -> None:
    guest: ScriptedGuest = agent.host.guest  # type: ignore[attr-defined]
    results, schemas = calls(
        agent,
        ("click", {"x": 100, "y": 200, "button": "back"}),
        ("click", {"count": 3, "keys": ["ctrl"]}),
        ("cursor_position", {}),
        ("mouse_down", {"button": "middle", "x": 5, "y": 6}),
        ("mouse_up", {"button": "middle"}),
        ("drag", {"x1": 0, "y1": 0, "x2": 80, "y2": 0, "seconds": 0.2, "keys": ["shift"]}),
        ("scroll", {"clicks": 2, "clicks_x": -1}),
        ("hold_keys", {"keys": ["alt"], "seconds": 0}),
        ("key_down", {"key": "Shift_L"}),
        ("key_up", {"key": "Shift_L"}),
        ("type_text", {"text": "café"}),
        ("zoom", {"x0": 0, "y0": 0, "x1": 960, "y1": 540, "width": 480}),
    )
    assert [r.isError for r in results] == [False] * len(results), [text(r) for r in results if r.isError]
    assert set(TOOLS) <= set(schemas)
    assert "x" not in schemas["click"].get("required", []) and schemas["click"]["properties"]["x"]["minimum"] == 0
    assert text(results[2]) == "pointer at (100, 200)"
    words = guest.timeline()
    assert words[:3] == ["@100,200", "B+side", "B-side"]
    assert words[3:10] == ["+ctrl", "B+left", "B-left", "B+left", "B-left", "B+left", "B-left"]
    assert words[11:14] == ["@5,6", "B+middle", "B-middle"]
    assert "+alt" in words and words.count("+shift") == 2  # held around the drag, and key_down
    assert any("xmodmap" in c for c in guest.commands) and any(c.endswith("--delay 10 6") for c in guest.commands)
    zoomed = results[-1]
    assert [c.type for c in zoomed.content] == ["image", "text"]
    image = Image.open(io.BytesIO(base64.b64decode(zoomed.content[0].data)))
    assert image.size == (480, 270) and image.getpixel((240, 135)) == (255, 0, 0)  # the red quarter, halved


@pytest.mark.parametrize(
    ("tool", "given", "reason"),
    [
        ("click", {"x": 5}, "give both x and y"),
        ("click", {"x": 5000, "y": 1}, "off the 1920x1080 screen"),
        ("zoom", {"x0": 0, "y0": 0, "x1": 4000, "y1": 10}, "is not inside the 1920x1080 screen"),
        ("key_down", {"key": "Hyper_Q"}, "unknown key 'Hyper_Q'"),
        ("type_text", {"text": "bell\x07"}, "cannot type"),
    ],
)
def test_what_the_desktop_cannot_do_is_a_tool_error_with_the_reason(
    agent: Agent, tool: str, given: dict[str, Any], reason: str
) -> None:
    guest: ScriptedGuest = agent.host.guest  # type: ignore[attr-defined]
    (result,), _ = calls(agent, (tool, given))
    assert result.isError and reason in text(result), text(result)
    assert guest.events == []
