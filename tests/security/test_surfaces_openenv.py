"""Red team: a client of ``osfleet openenv serve``'s agent surface writes its own task, and reads the verifier's
criteria to learn what it expected.

``osfleet openenv serve`` runs as a real process in front of a real host agent over the test fakes, driven by
openenv-core's own ``EnvClient`` (WebSocket) and by plain HTTP. The agent's surface (``/``, the client token or
the server's own user) takes a built-in task id but no task body, and an ended episode says its reward and success
only; the grader's (``/grader``, a token of its own) takes a task body and says every criterion.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_client import TOKEN, agent, openenv_server, raw_env_client, url_of  # noqa: F401 - agent is a fixture
from tests.test_fleet import Agent

CLIENT, GRADER = "openenv-client-token-0123456789", "openenv-grader-token-0123456789"
TASK = {  # the fake guest's check answers "yes" once a shell action has run
    "id": "fake-task",
    "instruction": "Run something.",
    "criteria": [{"name": "ran", "check": {"type": "command_output", "command": "check", "match": {"equals": "yes"}}}],
}


@pytest.fixture
def port(agent: Agent, tmp_path: Path) -> Iterator[int]:  # noqa: F811
    (tmp_path / "fleet-token").write_text(TOKEN + "\n")
    (tmp_path / "client").write_text(CLIENT + "\n")
    (tmp_path / "grader").write_text(GRADER + "\n")
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(TASK))
    options = ["--client-token-file", str(tmp_path / "client"), "--grader-token-file", str(tmp_path / "grader")]
    options += ["--task", str(task_file), "--max-steps", "5"]
    with openenv_server(url_of(agent), tmp_path / "fleet-token", tmp_path, *options) as p:
        yield p


def _post(url: str, body: dict[str, Any], token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.mark.system
def test_the_agents_surface_takes_no_task_body_and_tells_no_criterion(port: int, agent: Agent) -> None:  # noqa: F811
    status, body = _post(f"http://127.0.0.1:{port}/reset", {"task": TASK})
    assert status == 403 and "grader" in json.dumps(body), body  # over plain HTTP, from the server's own user

    async def main() -> None:
        async with raw_env_client(f"http://127.0.0.1:{port}") as c:
            with pytest.raises(RuntimeError, match="grader"):
                await c.reset(task=TASK)  # a task of its own writing: refused
            r = await c.reset()  # the server's task
            assert r.observation["instruction"] == "Run something."
            r = await c.step({"actions": [{"type": "shell", "command": "true"}]})
            r = await c.step({"actions": [{"type": "terminate"}]})
            assert r.done and r.reward == 1.0
            assert r.observation["evaluation"] == {"reward": 1.0, "success": True}  # no criterion, no detail

    asyncio.run(main())


@pytest.mark.system
def test_the_graders_surface_needs_its_own_token_and_tells_everything(port: int, agent: Agent) -> None:  # noqa: F811
    base = f"http://127.0.0.1:{port}/grader"
    assert _post(f"{base}/reset", {"task": TASK})[0] == 401  # the server's own user is not enough here
    assert _post(f"{base}/reset", {"task": TASK}, CLIENT)[0] == 401  # nor the agents' token
    assert _post(f"{base}/reset", {"task": TASK}, TOKEN)[0] == 401  # nor the fleet's

    async def main() -> None:
        async with raw_env_client(f"http://osfleet:{GRADER}@127.0.0.1:{port}/grader") as c:
            r = await c.reset(task=TASK)
            assert r.observation["instruction"] == "Run something."
            r = await c.step({"actions": [{"type": "terminate"}]})
            assert r.done and r.reward == 0.0
            criteria = r.observation["evaluation"]["criteria"]
            assert [c["name"] for c in criteria] == ["ran"] and criteria[0]["met"] is False

    asyncio.run(main())
