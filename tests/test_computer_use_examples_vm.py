"""The computer-use examples and bad input through a real host agent on a desktop image (heavy: run under the lock).

    flock /tmp/osfleet-heavy.lock .venv/bin/python -m pytest -m vm -n0 tests/test_computer_use_examples_vm.py

A point off the screen, an unknown key, a region outside the screen and a control character are 422 with the
reason over HTTP, and the replica goes on. examples/anthropic_computer.py and examples/openai_computer.py solve the
built-in task cli-write-note with the vendors' own SDKs (Anthropic's tool runner, openai-agents' Runner): their
APIs are played by loopback servers that answer as the models would (the cloud APIs cannot be reached from here; no
key is needed), so everything between the model's answer and the desktop is the real thing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from osfleet.vm.images import GoldenImage
from tests.conftest import REPO, local_agent
from tests.json_server import json_server
from tests.vendor_apis import ENVIRONMENTS, claude, gpt

pytestmark = [pytest.mark.vm, pytest.mark.slow]


@pytest.fixture(scope="module")
def agent(golden: GoldenImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    with local_agent(golden, tmp_path_factory.mktemp("apis-agent"), 1) as served:
        yield served


def test_what_the_desktop_cannot_do_is_a_422_with_the_reason(agent: tuple[Any, Path]) -> None:
    served, token_file = agent
    headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=120) as http:
        lease = http.post("/v1/leases", json={"holder": "apis-vm"}).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        try:
            for action, reason in (
                ({"type": "click", "x": 1280, "y": 5, "count": 2}, "(1280, 5) are off the 1280x800 screen"),
                ({"type": "hold_key", "keys": ["Hyper_Q"], "seconds": 1}, "unknown key 'Hyper_Q'"),
                ({"type": "screenshot", "region": [600, 0, 1300, 10]}, "is not inside the 1280x800 screen"),
                ({"type": "drag", "path": [[1, 1], [2000, 1]]}, "(2000, 1) are off"),
                ({"type": "type", "text": "bell\x07"}, "cannot type '\\x07'"),
            ):
                body = {"lease_id": lid, "action_id": reason, "actions": [action], "observe": False}
                r = http.post(f"/v1/replicas/{rid}/step", json=body)
                assert r.status_code == 422 and reason in r.json()["error"], r.text
            body = {"lease_id": lid, "action_id": "ok", "actions": [{"type": "cursor_position"}], "observe": False}
            [here] = http.post(f"/v1/replicas/{rid}/step", json=body).json()["results"]
            assert here["ok"] and 0 <= here["x"] < 1280 and 0 <= here["y"] < 800  # the replica went on
        finally:
            http.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid})


# --- the examples, with the vendors' APIs played on loopback ------------------------------------------------------
@pytest.mark.parametrize(("example", "answer"), [("anthropic_computer.py", claude), ("openai_computer.py", gpt)])
def test_the_example_solves_the_task_with_the_vendors_sdk(agent: tuple[Any, Path], example: str, answer: Any) -> None:
    served, token = agent
    with json_server(answer) as (url, seen):
        out = subprocess.run(
            [sys.executable, str(REPO / "examples" / example), served.url, str(token)],
            capture_output=True,
            text=True,
            timeout=600,
            env=ENVIRONMENTS[example](url),
            cwd="/",
        )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "-> reward 1.0" in out.stdout, out.stdout + out.stderr[-2000:]
    assert len(seen) >= 2  # the model was asked again after its actions ran
