"""``osfleet mcp serve`` through the ``mcp`` SDK's own client, over stdio and streamable HTTP, in front of a real
host agent (uvicorn) over a fake host: the tools and their schemas, a desktop per MCP session released when the
session ends, errors as tool errors, the HTTP transport's token and Origin checks.

The desktop's own behaviour (commands, files, the accessibility tree, scoring) is checked on a real replica in
tests/test_mcp_vm.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from osfleet.mcp.server import TOOLS
from osfleet.replicas.input import InputError
from tests.fakes import FakeHost
from tests.test_fleet import Agent, free_port

pytestmark = pytest.mark.system
REPO = Path(__file__).resolve().parent.parent
CALL_SECONDS = 60


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent("h", FakeHost(tmp_path / "h", ready=2, max_replicas=4), free_port())
    a.start()
    yield a
    a.stop()


@pytest.fixture
def token_file(agent: Agent, tmp_path: Path) -> Path:
    f = tmp_path / "token"
    f.write_text(agent.entry.token + "\n")
    return f


def _serve_args(agent: Agent, token_file: Path, *extra: str) -> list[str]:
    return ["-m", "osfleet", "mcp", "serve", "--url", agent.entry.url, "--token-file", str(token_file), *extra]


def _leased(agent: Agent) -> set[str]:
    """The replicas held by a lease now (one whose time ran out holds nothing, even before the fleet notices)."""
    return {r.id for r in agent.host.replicas() if r.lease is not None and r.lease.expires_at > time.time()}


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def _session_checks(s: ClientSession, agent: Agent) -> None:
    await asyncio.wait_for(s.initialize(), CALL_SECONDS)
    tools = {t.name: t for t in (await s.list_tools()).tools}
    assert set(TOOLS) <= set(tools)
    assert _leased(agent) == set()  # nothing is leased until a tool needs the desktop
    x = tools["click"].inputSchema["properties"]["x"]
    assert x["minimum"] == 0 and "pixels" in x["description"]
    assert tools["scroll"].inputSchema["properties"]["clicks"]["maximum"] == 50
    assert "seconds" in tools["wait"].inputSchema["properties"]["seconds"]["description"]

    shot = await asyncio.wait_for(s.call_tool("screenshot", {}), CALL_SECONDS)
    assert not shot.isError and [c.type for c in shot.content] == ["image", "text"]
    assert shot.content[0].mimeType == "image/png"
    (leased,) = _leased(agent)

    clicked = await asyncio.wait_for(s.call_tool("click", {"x": 10, "y": 20, "button": "right"}), CALL_SECONDS)
    assert not clicked.isError, _text(clicked)
    rid, actions = agent.host.applied[-1]
    assert rid == leased and actions[0].model_dump()["button"] == "right"

    bad = await asyncio.wait_for(s.call_tool("click", {"x": "left", "y": 1}), CALL_SECONDS)
    assert bad.isError and "x" in _text(bad)
    agent.host.act_error = InputError("click: coordinates (5000, 1) are off the 1280x800 screen")
    off_screen = await asyncio.wait_for(s.call_tool("click", {"x": 5000, "y": 1}), CALL_SECONDS)
    agent.host.act_error = None
    assert off_screen.isError and "off the 1280x800 screen" in _text(off_screen)
    assert set(tools["reset"].inputSchema.get("properties", {})) == set()  # an agent cannot choose its task
    unscored = await asyncio.wait_for(s.call_tool("evaluate", {}), CALL_SECONDS)
    assert unscored.isError  # no task was set: the fleet's 409, as a tool error
    # the session goes on after every one of those
    again = await asyncio.wait_for(s.call_tool("move_mouse", {"x": 1, "y": 1, "observe": True}), CALL_SECONDS)
    assert not again.isError and [c.type for c in again.content] == ["text", "image", "text"]
    assert _leased(agent) == {leased}  # one desktop for the whole session


def test_over_stdio_one_desktop_per_session_released_when_it_ends(agent: Agent, token_file: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=_serve_args(agent, token_file), cwd=str(REPO), env=dict(os.environ)
    )

    async def run() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await _session_checks(s, agent)

    asyncio.run(run())
    deadline = time.monotonic() + 30
    while _leased(agent) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leased(agent) == set()  # released when the session ended (stdin closed)


@pytest.fixture
def http_server(http_process: tuple[str, subprocess.Popen[bytes]]) -> str:
    return http_process[0]


MCP_TOKEN = "mcp-agents-token-0123456789abcdef"  # what MCP clients present over HTTP (never the fleet's token)


@pytest.fixture
def http_process(agent: Agent, token_file: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    log = (tmp_path / "mcp.log").open("wb")
    (tmp_path / "mcp-token").write_text(MCP_TOKEN + "\n")
    http = ["--transport", "http", "--port", str(port), "--http-token-file", str(tmp_path / "mcp-token")]
    proc = subprocess.Popen(
        [sys.executable, *_serve_args(agent, token_file, *http)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
        except urllib.error.HTTPError:
            break  # it answers (401: no token)
        except OSError:
            time.sleep(0.1)
    try:
        yield url, proc
    finally:
        proc.terminate()
        assert proc.wait(30) is not None
        log.close()


def _post(url: str, headers: dict[str, str]) -> int:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_over_http_a_token_is_needed_and_a_foreign_origin_is_refused(http_server: str, agent: Agent) -> None:
    accept = {"Accept": "application/json, text/event-stream"}
    assert _post(http_server, accept) == 401
    assert _post(http_server, {**accept, "Authorization": "Bearer wrong-token"}) == 401
    assert _post(http_server, {**accept, "Authorization": f"Bearer {agent.entry.token}"}) == 401  # the fleet's
    assert (
        _post(http_server, {**accept, "Authorization": f"Bearer {MCP_TOKEN}", "Origin": "https://evil.example"}) == 403
    )
    port = http_server.split(":")[2].split("/")[0]
    other_port = {"Authorization": f"Bearer {MCP_TOKEN}", "Origin": f"http://127.0.0.1:{int(port) + 1}"}
    assert _post(http_server, {**accept, **other_port}) == 403  # a page of another server of this machine
    assert _leased(agent) == set()


def test_over_http_each_session_has_its_own_desktop(http_server: str, agent: Agent) -> None:
    headers = {"Authorization": f"Bearer {MCP_TOKEN}"}

    async def one(seen: list[str], hold: asyncio.Event, go: asyncio.Event) -> None:
        async with (
            httpx.AsyncClient(headers=headers, timeout=CALL_SECONDS) as http,
            streamable_http_client(http_server, http_client=http) as (r, w, _),
            ClientSession(r, w) as s,
        ):
            await asyncio.wait_for(s.initialize(), CALL_SECONDS)
            shot = await asyncio.wait_for(s.call_tool("screenshot", {}), CALL_SECONDS)
            assert not shot.isError, _text(shot)
            seen.append("ok")
            hold.set()
            await go.wait()

    async def run() -> None:
        seen: list[str] = []
        a_ready, b_ready, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(one(seen, a_ready, go)), asyncio.create_task(one(seen, b_ready, go))]
        await asyncio.wait_for(asyncio.gather(a_ready.wait(), b_ready.wait()), CALL_SECONDS)
        assert len(_leased(agent)) == 2  # two sessions, two desktops
        go.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())
    deadline = time.monotonic() + 30
    while _leased(agent) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leased(agent) == set()  # each released when its session was closed (DELETE)


def test_a_server_stopped_mid_session_gives_its_desktops_back(
    http_process: tuple[str, subprocess.Popen[bytes]], agent: Agent
) -> None:
    url, proc = http_process
    headers = {"Authorization": f"Bearer {MCP_TOKEN}"}

    async def run() -> None:
        async with (
            httpx.AsyncClient(headers=headers, timeout=CALL_SECONDS) as http,
            streamable_http_client(url, http_client=http) as (r, w, _),
            ClientSession(r, w) as s,
        ):
            await asyncio.wait_for(s.initialize(), CALL_SECONDS)
            assert not (await asyncio.wait_for(s.call_tool("screenshot", {}), CALL_SECONDS)).isError
            assert len(_leased(agent)) == 1
            proc.terminate()  # SIGTERM while the session is open
            assert proc.wait(60) is not None

    asyncio.run(run())  # the SDK's client closes quietly (a warning) when the server has gone
    assert _leased(agent) == set()


def test_a_lease_that_ran_out_is_said_and_the_next_call_leases_a_new_desktop(agent: Agent, token_file: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=_serve_args(agent, token_file, "--lease-ttl", "1"), cwd=str(REPO)
    )

    async def run() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await asyncio.wait_for(s.initialize(), CALL_SECONDS)
            assert not (await asyncio.wait_for(s.call_tool("screenshot", {}), CALL_SECONDS)).isError
            (rec,) = [r for r in agent.host.replicas() if r.lease is not None]
            assert rec.lease is not None
            while time.time() <= rec.lease.expires_at:  # the lease's own time, not a guess at one
                await asyncio.sleep(0.1)
            lost = await asyncio.wait_for(s.call_tool("screenshot", {}), CALL_SECONDS)
            assert lost.isError and "the next call leases a new desktop" in _text(lost)
            again = await asyncio.wait_for(s.call_tool("screenshot", {}), CALL_SECONDS)
            assert not again.isError and len(_leased(agent)) == 1

    asyncio.run(run())
