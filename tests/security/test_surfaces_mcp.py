"""Red team: an agent behind ``osfleet mcp serve`` tries to swap its task and to learn its score.

``osfleet mcp serve`` runs as a real process (the ``mcp`` SDK's own client drives it, over stdio and streamable HTTP)
in front of a real host agent over the test fakes. The agent's surface (the default) has no ``reset`` with a task
and no ``evaluate`` that answers the score: it can neither pick an easy task nor probe the verifier. The grader's
surface needs a token of its own (never the agents', never the fleet's), assigns the agent session's task and reads
its score.
"""

from __future__ import annotations

import asyncio
import json
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

from tests.test_fleet import Agent, free_port
from tests.test_mcp import agent, token_file  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[2]
CALL_SECONDS = 60
AGENTS, GRADERS = "mcp-agents-token-0123456789abcdef", "mcp-graders-token-0123456789abcdef"
# The fake guest's check answers "yes" once a shell action has run: 0 at the start, 1 after one.
TASK = {
    "id": "fake-task",
    "instruction": "Run something.",
    "criteria": [{"name": "ran", "check": {"type": "command_output", "command": "check", "match": {"equals": "yes"}}}],
}
EASY = {  # what an agent would rather be scored on: a criterion that holds from the start
    "id": "easy",
    "instruction": "Nothing to do.",
    "criteria": [{"name": "ran", "check": {"type": "command_output", "command": "check", "match": {"equals": ""}}}],
}


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def _call(s: ClientSession, name: str, arguments: dict[str, Any]) -> Any:
    return await asyncio.wait_for(s.call_tool(name, arguments), CALL_SECONDS)


@pytest.mark.system
def test_an_agent_can_neither_swap_its_task_nor_learn_its_score(
    agent: Agent,  # noqa: F811
    token_file: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    task_file, results = tmp_path / "task.json", tmp_path / "results.jsonl"
    task_file.write_text(json.dumps(TASK))
    args = ["-m", "osfleet", "mcp", "serve", "--url", agent.entry.url, "--token-file", str(token_file)]
    args += ["--task", str(task_file), "--results-file", str(results)]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(REPO), env=dict(os.environ))

    async def run() -> None:
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await asyncio.wait_for(s.initialize(), CALL_SECONDS)
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert not tools["reset"].inputSchema.get("properties")  # no task_id, no task: nothing to swap to
            swapped = await _call(s, "reset", {"task": EASY, "task_id": "easy"})  # sent anyway
            assert not swapped.isError and _text(swapped).startswith("task fake-task: Run something.")
            done = await _call(s, "evaluate", {})  # at the start: the verifier would say 0
            assert not done.isError and "submitted" in _text(done)
            assert "reward" not in _text(done) and "ran" not in _text(done)  # no score, no criterion
            await _call(s, "run_command", {"command": "true"})
            again = await _call(s, "evaluate", {})
            assert "reward" not in _text(again)

    asyncio.run(run())
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert [(x["task_id"], x["reward"]) for x in lines] == [("fake-task", 0.0), ("fake-task", 1.0)]  # for the grader
    assert lines[1]["criteria"][0]["name"] == "ran"


@pytest.fixture
def served(agent: Agent, token_file: Path, tmp_path: Path) -> Iterator[str]:  # noqa: F811
    port = free_port()
    (tmp_path / "agents").write_text(AGENTS + "\n")
    (tmp_path / "graders").write_text(GRADERS + "\n")
    args = ["-m", "osfleet", "mcp", "serve", "--url", agent.entry.url, "--token-file", str(token_file)]
    args += ["--transport", "http", "--port", str(port), "--http-token-file", str(tmp_path / "agents")]
    args += ["--grader-token-file", str(tmp_path / "graders")]
    log = (tmp_path / "mcp.log").open("wb")
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/mcp", timeout=2)
        except urllib.error.HTTPError:
            break  # it answers (401: no token)
        except OSError:
            time.sleep(0.1)
    try:
        yield base
    finally:
        proc.terminate()
        assert proc.wait(30) is not None
        log.close()


def _post(url: str, token: str) -> int:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    req = urllib.request.Request(url, data=body, method="POST", headers={**headers, "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.system
def test_the_graders_surface_needs_its_own_token(served: str, agent: Agent) -> None:  # noqa: F811
    fleet = agent.entry.token
    assert _post(f"{served}/grader", AGENTS) == 401  # the agents' token never opens the grader's surface
    assert _post(f"{served}/grader", fleet) == 401
    assert _post(f"{served}/mcp", GRADERS) == 401  # nor the other way round: one token, one surface
    assert _post(f"{served}/mcp", fleet) == 401
    assert _post(f"{served}/grader", GRADERS) != 401 and _post(f"{served}/mcp", AGENTS) != 401


@pytest.mark.system
def test_a_grader_gives_an_agent_session_its_task_and_reads_its_score(served: str) -> None:
    async def session(path: str, token: str) -> Any:
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=CALL_SECONDS)
        return http, streamable_http_client(f"{served}{path}", http_client=http)

    async def run() -> None:
        agent_http, agent_transport = await session("/mcp", AGENTS)
        grader_http, grader_transport = await session("/grader", GRADERS)
        async with agent_http, agent_transport as (ar, aw, agent_id), ClientSession(ar, aw) as agent_s:
            await asyncio.wait_for(agent_s.initialize(), CALL_SECONDS)
            sid = agent_id()
            assert sid
            async with grader_http, grader_transport as (gr, gw, _), ClientSession(gr, gw) as grader_s:
                await asyncio.wait_for(grader_s.initialize(), CALL_SECONDS)
                agent_tools = {t.name for t in (await agent_s.list_tools()).tools}
                assert not {"sessions", "assign_task", "evaluate_session"} & agent_tools
                assigned = await _call(grader_s, "assign_task", {"session": sid, "task": TASK})
                assert not assigned.isError, _text(assigned)
                started = await _call(agent_s, "reset", {})
                assert _text(started).startswith("task fake-task: Run something.")
                await _call(agent_s, "run_command", {"command": "true"})
                done = await _call(agent_s, "evaluate", {})
                assert "submitted" in _text(done) and "reward" not in _text(done)
                listed = json.loads(_text(await _call(grader_s, "sessions", {})))
                (mine,) = [x for x in listed if x["session"] == sid]
                assert mine["task"] == "fake-task" and mine["submitted"]["reward"] == 1.0
                scored = await _call(grader_s, "evaluate_session", {"session": sid})
                assert _text(scored).startswith("reward 1, success true") and "- ran: met" in _text(scored)

    asyncio.run(run())
