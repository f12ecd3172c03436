"""The pages' examples, run as written against ``osfleet e2b serve`` and ``osfleet cua serve`` over a real host agent
whose guest is a stand-in (tests/e2b_guest.py, tests/scripted_guest.py): examples/e2b_write_note.py with e2b-desktop
in a venv of its own, examples/cua_write_note.py with cua-computer, which looks for its server on localhost:8000 (the
example runs in a mount namespace whose /etc/hosts names a loopback address of the test's own as localhost, so it
never meets whatever listens on this machine's 127.0.0.1:8000)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from osfleet.api.app import create_app as create_agent_app
from osfleet.config import AgentConfig
from osfleet.cua.app import LeaseOptions
from osfleet.cua.app import create_app as create_cua_app
from tests import e2b_desktop_venv
from tests.e2b_guest import ALICE, OPERATOR, Look, Served, ThreadServer
from tests.scripted_guest import SCREEN, DesktopHost, ScriptedGuest

pytestmark = [pytest.mark.system, pytest.mark.slow]  # the examples run as processes; e2b-desktop needs its own venv

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_e2b_desktop_example_runs_as_written(tmp_path: Path) -> None:
    python = e2b_desktop_venv.make(tmp_path)
    stack = Served(tmp_path / "stack")
    stack.guest.programs["cat ~/notes/todo.txt"] = [Look(b"buy milk\n")]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "E2B_API_KEY": ALICE}
    env |= {"E2B_API_URL": stack.url, "E2B_SANDBOX_URL": stack.url}
    try:
        done = subprocess.run(
            [python, str(EXAMPLES / "e2b_write_note.py")],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
    finally:
        stack.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "buy milk\n" and (tmp_path / "screen.png").read_bytes()[:4] == b"\x89PNG"
    assert "@200,200" in stack.guest.timeline() and stack.leased() == []


def test_the_cua_example_runs_as_written(tmp_path: Path) -> None:
    guest = ScriptedGuest({r"cat ~/notes/todo.txt": {"stdout": "buy milk\n"}}, SCREEN)
    host = DesktopHost(tmp_path / "host", ready=1, guest=guest)
    agent = ThreadServer(create_agent_app(AgentConfig(token=OPERATOR), lambda: host))
    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    cua = ThreadServer(
        create_cua_app(LeaseOptions(agent.url, OPERATOR, wait=10), "cua-own-token-0123456789"), host=address, port=8000
    )
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{address} localhost\n")
    example = f"mount --bind {hosts} /etc/hosts && exec {sys.executable} {EXAMPLES / 'cua_write_note.py'}"
    try:
        done = subprocess.run(
            ["unshare", "--mount", "sh", "-c", example],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "CUA_TELEMETRY_ENABLED": "false"},
        )
    finally:
        cua.stop()
        agent.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "screen 1920 x 1080\nbuy milk\n"
    assert "@200,200" in guest.timeline() and [r for r in host.replicas() if r.lease is not None] == []
