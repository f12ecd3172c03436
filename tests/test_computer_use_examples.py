"""The computer-use examples, run as written, on a stand-in desktop: examples/anthropic_computer.py (Anthropic's
tool runner with osfleet's toolset) and examples/openai_computer.py (openai-agents' Runner with a computer provider)
against a real host agent whose actions run through osfleet's action runner into a scripted guest, the vendors'
APIs played on loopback (tests/vendor_apis.py). On a real replica, solving the task:
tests/test_computer_use_examples_vm.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.json_server import json_server
from tests.scripted_guest import DesktopHost, ScriptedGuest
from tests.test_fleet import Agent, free_port
from tests.vendor_apis import ENVIRONMENTS, NOTE, claude, gpt

pytestmark = pytest.mark.system  # the examples run as commands


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, Path]]:
    a = Agent("examples", DesktopHost(tmp_path / "h", ready=1), free_port())
    a.start()
    token = tmp_path / "token"
    token.write_text(a.entry.token + "\n")
    yield a, token
    a.stop()


@pytest.mark.parametrize(
    ("example", "answer", "click"),
    [
        ("anthropic_computer.py", claude, "@269,269"),  # Claude's (200, 200) on a 1429x804 screenshot of 1920x1080
        ("openai_computer.py", gpt, "@200,200"),  # the desktop's own pixels
    ],
)
def test_the_example_runs_the_models_actions_on_the_desktop(
    agent: tuple[Agent, Path], example: str, answer: Any, click: str
) -> None:
    served, token = agent
    guest: ScriptedGuest = served.host.guest  # type: ignore[attr-defined]
    with json_server(answer) as (url, seen):
        out = subprocess.run(
            [sys.executable, str(REPO / "examples" / example), served.entry.url, str(token)],
            capture_output=True,
            text=True,
            timeout=300,
            env=ENVIRONMENTS[example](url),
            cwd="/",
        )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "-> reward" in out.stdout and "The note is written." in out.stdout, out.stdout
    assert len(seen) >= 2  # the model was asked again with its actions' results
    words = guest.timeline()
    assert words[words.index(click) + 1] == "B+left"  # the click, mapped to the desktop
    typed = [w[1:] for w in words if w.startswith("+")]
    assert len(typed) > len(NOTE) and typed[-1] == "ret"  # the command, then Enter
