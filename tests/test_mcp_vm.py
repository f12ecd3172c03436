"""``osfleet mcp serve`` on a real replica of the office image (OSWorld's desktop, whose accessibility tree the tool
reads), through the ``mcp`` SDK's client: the documented example and configuration as written, a command's effect
read back, a file written and read, the tree as XML, a task submitted by the agent and scored for its harness, and a
grader's reset to a task and its score.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from osfleet.bench.load import LocalAgent
from osfleet.vm.images import GoldenImage

pytestmark = [pytest.mark.vm, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CALL_SECONDS = 300


@pytest.fixture(scope="module")
def agent(office_image: GoldenImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAgent, Path]]:
    folder = tmp_path_factory.mktemp("mcp")
    os.environ["OSFLEET_RECORD"] = "0"
    a = LocalAgent(1, folder / "agent.log", office_image.name)
    try:
        a.wait_ready(1, 900)
        token = folder / "token"
        token.write_text(a.token + "\n")
        yield a, token
    finally:
        a.stop()


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_the_documented_mcp_client_example_scores_the_task(agent: tuple[LocalAgent, Path]) -> None:
    a, token = agent
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "mcp_client.py"), a.url, str(token)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tools: screenshot, click," in out.stdout
    assert "the note says: buy milk" in out.stdout
    assert out.stdout.rstrip().endswith("reward 1, success true"), out.stdout


def test_the_documented_configuration_starts_a_server_whose_tools_work(agent: tuple[LocalAgent, Path]) -> None:
    a, token = agent
    server = json.loads((REPO / "examples" / "mcp_config.json").read_text())["mcpServers"]["osfleet"]
    args = [
        a.url if x == "http://127.0.0.1:8080" else str(token) if x.endswith("api-token") else x for x in server["args"]
    ]
    params = StdioServerParameters(command=str(BIN / server["command"]), args=args, cwd=str(REPO))

    async def run() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await asyncio.wait_for(s.initialize(), CALL_SECONDS)

            async def call(name: str, arguments: dict[str, Any]) -> Any:
                result = await asyncio.wait_for(s.call_tool(name, arguments), CALL_SECONDS)
                assert not result.isError, f"{name}: {_text(result)}"
                return result

            ran = await call("run_command", {"command": "id -un; echo err >&2; exit 3"})
            assert _text(ran).startswith("exit code 3") and "user" in _text(ran) and "err" in _text(ran)
            await call("write_file", {"path": "/home/user/mcp/in.txt", "text": "über\n"})
            assert _text(await call("read_file", {"path": "/home/user/mcp/in.txt"})) == "über\n"
            raw = bytes(range(256))
            await call("write_file", {"path": "/tmp/raw.bin", "content_base64": base64.b64encode(raw).decode()})
            blob = (await call("read_file", {"path": "/tmp/raw.bin"})).content[0].resource.blob
            assert base64.b64decode(blob) == raw
            tree = _text(await call("accessibility_tree", {}))
            assert tree.startswith("<") and "desktop-frame" in tree
            outside = await asyncio.wait_for(s.call_tool("read_file", {"path": "/root/secret"}), CALL_SECONDS)
            assert outside.isError  # the desktop user cannot read it: a tool error, the session goes on
            assert _text(await call("reset", {})).startswith("reset to the initial state (no task)")

    asyncio.run(run())


def test_a_grader_resets_to_any_task_and_reads_its_score(agent: tuple[LocalAgent, Path]) -> None:
    a, token = agent
    args = ["-m", "osfleet", "mcp", "serve", "--url", a.url, "--token-file", str(token), "--role", "grader"]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(REPO))

    async def run() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await asyncio.wait_for(s.initialize(), CALL_SECONDS)
            started = await asyncio.wait_for(s.call_tool("reset", {"task_id": "cli-write-note"}), CALL_SECONDS)
            assert not started.isError and _text(started).startswith("task cli-write-note:")
            scored = await asyncio.wait_for(s.call_tool("evaluate", {}), CALL_SECONDS)
            assert _text(scored).startswith("reward 0, success false")  # the initial state scores 0

    asyncio.run(run())
